"""LFM2 (tests/models.py "lfm2": gated short convolutions and full-attention layers, each twice): the
convolutions' state is a fixed ring of inputs in the recurrent state arena that the plan names and
report counts, speculative decoding steps it back exactly, a conversation keeps it between turns,
and the emulated boards decode the reference's bits. LFM2-MoE ("lfm2_moe") pages its experts under
the smallest budget and runs on qemu-rv32 with the same bits. tests/numerics/test_oracle.py checks
the f32 firmware of both against transformers and q8_0 against the reference on host."""

from __future__ import annotations

import pytest
from test_qwen35_moe import assert_report_says_the_state_is_fixed

from generator.boards import load_board
from generator.compile.cache_plan import cache_plan
from generator.compile.plan import make_plan, plan_for_board
from generator.device.runner import run_on_board
from generator.device.session import RunRequest, cache_stats
from generator.model.hf.load import load_hf
from generator.numerics.sampling import SamplingParams
from generator.reference import Reference
from generator.verify import compare, rates, reference_run

KIND = "lfm2"
PROMPT = [1, 17, 42, 99, 7, 3, 250, 64, 128]  # longer than the convolution's 3 taps
# A prompt that repeats itself, so that prompt lookup drafts (most of them dropped, some taken).
REPEATING = [1, 45, 96, 30, 12, 45, 96, 30, 12, 45, 96, 30, 12, 45, 96]
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)


def test_the_convolution_state_is_a_fixed_ring_beside_a_kv_cache_of_the_attention_layers_only(checkpoints):
    spec = load_hf(checkpoints(KIND), load_tensors=False).spec
    assert spec.short_conv_layers == (True, False, True, False) and spec.short_conv_kernel == 3
    assert spec.intermediate_size == 160 and spec.qk_norm and spec.tie_embeddings  # int(2/3 144 x 1.5) up to 32
    small, large = make_plan(spec, "host", "q8_0", 32), make_plan(spec, "host", "q8_0", 128)
    for plan in (small, large):
        # Per convolution layer the last 2 inputs of its window and one for the pass's token, 64 channels.
        assert plan.short_conv_ring_rows == 3
        assert plan.linear_state_bytes == 2 * 3 * 64 * 4
        assert plan.linear_state_offsets == (0, -1, 3 * 64, -1)
        assert plan.kv_slots == (0, plan.n_ctx, 0, plan.n_ctx)  # keys and values of the attention layers only
    assert large.context_state_bytes - small.context_state_bytes == large.kv_bytes - small.kv_bytes
    assert_report_says_the_state_is_fixed(
        small,
        large,
        "  short convolution state: 2 layers x 768 B (the last 3 inputs of 64 channels) = 1,536 B, fixed: it "
        "does not grow with the context (counted under kv_cache, beside the KV cache of the 2 attention layers)",
    )
    # With room for speculative decoding (host: 8 tokens a pass), the ring keeps a pass's worth more.
    host = load_board("host")
    assert plan_for_board(spec, host, "q8_0", 64).speculate_tokens == 8
    assert plan_for_board(spec, host, "q8_0", 64).short_conv_ring_rows == 2 + 8


def run(board, art, request):
    return run_on_board(board, art.program, art.weights, request, art.model_hash())


@pytest.mark.slow  # one firmware build and three runs on host (about 15 s)
def test_speculative_decoding_steps_the_ring_back_to_plain_decodings_bits(checkpoints, builder):
    board, art, plan = builder.build(checkpoints(KIND), "q8_0", 128)
    # The prompt again after what the model said to it: prompt lookup drafts that continuation, and
    # decoding takes some of the drafted tokens and drops the others.
    echo = run(board, art, RunRequest(REPEATING, 12, stop_at_eos=False)).tokens
    prompt = REPEATING + echo + REPEATING
    plain = run(board, art, RunRequest(prompt, 40, stop_at_eos=False))
    request = RunRequest(prompt, 40, stop_at_eos=False, speculate=7, threads=2)
    fast = run(board, art, request)
    assert fast.tokens == plain.tokens and fast.digests == plain.digests
    assert compare(fast, reference_run(plan, art.weights, request)).passed
    speculation = rates(fast).speculation
    assert speculation is not None and speculation["drafted"] > speculation["accepted"] > 0


@pytest.mark.slow  # the host build above, a conversation of two turns, sampled, with and without speculation
def test_a_conversation_keeps_the_ring_between_turns(checkpoints, builder):
    from generator.device.links import open_link

    board, art, plan = builder.build(checkpoints(KIND), "q8_0", 128)
    reference = Reference(plan, art.weights.read_bytes())
    first_ref = reference.generate(REPEATING, 12, SAMPLED, stop_at_eos=False)
    second_ref = reference.generate([7, 45, 96], 12, SAMPLED, stop_at_eos=False, start=first_ref.held)
    for speculate in (0, 7):
        with open_link(board, art.program, art.weights, art.model_hash(), keep_open=True) as link:
            first = link.turn(RunRequest(REPEATING, 12, SAMPLED, stop_at_eos=False, speculate=speculate))
            second = link.turn(
                RunRequest([7, 45, 96], 12, SAMPLED, stop_at_eos=False, start=first.held, speculate=speculate)
            )
        assert (first.tokens, first.digests) == (first_ref.tokens, first_ref.digests), speculate
        assert (second.tokens, second.digests) == (second_ref.tokens, second_ref.digests), speculate


@pytest.mark.slow  # runs under qemu-aarch64 and qemu-system-riscv32
@pytest.mark.parametrize("board", ["linux-aarch64", "qemu-rv32"])
def test_emulated_boards_decode_the_reference_bits(board, checkpoints, builder):
    art, plan, request, result = builder.run(checkpoints(KIND), PROMPT, 12, quant="q8_0", sampling=SAMPLED, board=board)
    assert compare(result, reference_run(plan, art.weights, request)).passed
    assert plan.linear_state_bytes > 0 and result.hello["board"] == board


@pytest.mark.slow  # one host build, a run unlimited and one at the smallest budget (about 10 s)
def test_lfm2_moe_pages_its_experts_with_the_same_bits(checkpoints, builder):
    board, art, plan = builder.build(checkpoints("lfm2_moe"), "q8_0", 64)
    assert plan.spec.moe_layers == (False, True, True, True) and plan.spec.router == "sigmoid"
    assert plan.speculate_tokens == 0  # experts: it decodes plainly, as every MoE
    min_budget = cache_plan(plan, board.budget_reserve, 0).constants.min_budget
    for budget, threads in ((0, 1), (min_budget, 2)):
        request = RunRequest(PROMPT, 16, SAMPLED, stop_at_eos=False, threads=threads, memory_budget=budget)
        result = run(board, art, request)
        ref = reference_run(plan, art.weights, request)
        assert compare(result, ref).passed and result.expert_counts == ref.expert_counts, budget
        assert cache_stats(result).cache_misses > 0 or not budget  # top-2 slots for 3 MoE layers: evicting


@pytest.mark.slow  # runs under qemu-system-riscv32
def test_lfm2_moe_decodes_the_reference_bits_on_qemu_rv32(checkpoints, builder):
    art, plan, request, result = builder.run(
        checkpoints("lfm2_moe"), PROMPT, 12, quant="q8_0", sampling=SAMPLED, board="qemu-rv32"
    )
    ref = reference_run(plan, art.weights, request)
    assert compare(result, ref).passed and result.expert_counts == ref.expert_counts
