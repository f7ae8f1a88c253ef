"""Granite 4.0 hybrid (tests/models.py "granite_hybrid": Mamba-2 and attention layers without RoPE,
each twice; "granite_hybrid_moe": the same with RoPE, experts beside the shared MLP, dt clamped): the
Mamba-2 state is fixed in the recurrent state arena that the plan names and report counts, it is
kept between the turns of a conversation, speculative decoding is not offered (the state cannot step
back), and the emulated boards decode the reference's bits. tests/numerics/test_oracle.py checks the
f32 firmware of both against transformers and q8_0 against the reference on host."""

from __future__ import annotations

import pytest
from test_qwen35_moe import assert_report_says_the_state_is_fixed

from generator.boards import load_board
from generator.compile.plan import make_plan, plan_for_board
from generator.device.session import RunRequest
from generator.model.hf.load import load_hf
from generator.numerics.sampling import SamplingParams
from generator.reference import Reference
from generator.verify import compare, reference_run

PROMPT = [1, 17, 42, 99, 7, 3, 250, 64, 128]  # longer than the convolution's 4 taps
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)


def test_the_mamba_state_is_fixed_beside_a_kv_cache_of_the_attention_layers_only(checkpoints):
    spec = load_hf(checkpoints("granite_hybrid"), load_tensors=False).spec
    assert spec.mamba_layers == (True, False, True, False) and spec.mamba_inner == 128
    assert (spec.mamba_heads, spec.mamba_head_dim, spec.mamba_groups, spec.mamba_state) == (8, 16, 2, 16)
    assert spec.rope.rotated_fraction == 0.0 and spec.residual_scale == 0.7 and spec.logits_scaling == 2.5
    small, large = make_plan(spec, "host", "q8_0", 32), make_plan(spec, "host", "q8_0", 128)
    per_layer = 3 * (128 + 2 * 2 * 16) + 8 * 16 * 16  # the convolution's last 3 inputs, then the heads' states
    for plan in (small, large):
        assert plan.linear_state_bytes == 2 * per_layer * 4
        assert plan.linear_state_offsets == (0, -1, per_layer, -1)
        assert plan.kv_slots == (0, plan.n_ctx, 0, plan.n_ctx)  # keys and values of the attention layers only
    assert_report_says_the_state_is_fixed(
        small,
        large,
        "  Mamba-2 state: 2 layers x 10,496 B (convolution 2,304 B + SSM 8,192 B) = 20,992 B, fixed: it does not "
        "grow with the context (counted under kv_cache, beside the KV cache of the 2 attention layers)",
    )
    # The state cannot step back: no speculative pass, whatever the board offers.
    assert plan_for_board(spec, load_board("host"), "q8_0", 64).speculate_tokens == 0


@pytest.mark.slow  # one host build, a conversation of two turns, sampled
def test_a_conversation_keeps_the_mamba_state_between_turns(checkpoints, builder):
    from generator.device.links import open_link

    board, art, plan = builder.build(checkpoints("granite_hybrid"), "q8_0", 128)
    reference = Reference(plan, art.weights.read_bytes())
    first_ref = reference.generate(PROMPT, 12, SAMPLED, stop_at_eos=False)
    second_ref = reference.generate([7, 45, 96], 12, SAMPLED, stop_at_eos=False, start=first_ref.held)
    with open_link(board, art.program, art.weights, art.model_hash(), keep_open=True) as link:
        first = link.turn(RunRequest(PROMPT, 12, SAMPLED, stop_at_eos=False))
        second = link.turn(RunRequest([7, 45, 96], 12, SAMPLED, stop_at_eos=False, start=first.held))
    assert (first.tokens, first.digests) == (first_ref.tokens, first_ref.digests)
    assert (second.tokens, second.digests) == (second_ref.tokens, second_ref.digests)


@pytest.mark.slow  # runs under qemu-aarch64 and qemu-system-riscv32 (builds shared with the other tests)
@pytest.mark.parametrize("kind, board", [("granite_hybrid", "linux-aarch64"), ("granite_hybrid_moe", "qemu-rv32")])
def test_emulated_boards_decode_the_reference_bits(kind, board, checkpoints, builder):
    art, plan, request, result = builder.run(checkpoints(kind), PROMPT, 12, quant="q8_0", sampling=SAMPLED, board=board)
    ref = reference_run(plan, art.weights, request)
    assert compare(result, ref).passed and result.expert_counts == ref.expert_counts
    assert plan.linear_state_bytes > 0 and result.hello["board"] == board
