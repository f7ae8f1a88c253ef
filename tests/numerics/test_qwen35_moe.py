"""Qwen3.5-MoE's text tower (tests/models.py "qwen3_5_moe": 3 Gated DeltaNet layers and 1 gated
full-attention layer, 8 experts top-2 and a shared expert): its recurrent state is a fixed arena the
plan accounts for, and the firmware decodes the reference's bits (tokens and every step's logits
SHA-256) with q8_0 and q4_0, greedy and sampled, on 1 and 2 threads, under a memory budget, and on
the emulated boards. tests/numerics/test_oracle.py checks the f32 firmware against transformers."""

from __future__ import annotations

import pytest
from cli_runs import verify_passes

from generator.boards import load_board
from generator.compile.cache_plan import cache_plan
from generator.compile.plan import make_plan
from generator.device.runner import run_on_board
from generator.device.session import RunRequest, cache_stats
from generator.model.hf.load import load_hf
from generator.numerics.sampling import SamplingParams
from generator.report import format_report, planned_report
from generator.verify import compare, reference_run

PROMPT = [1, 17, 42, 99, 7, 3, 250, 64, 128]  # longer than the convolution's window
STEPS = 16
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)
KIND = "qwen3_5_moe"


def test_the_recurrent_state_is_a_fixed_arena_beside_a_kv_cache_of_the_attention_layers_only(checkpoints):
    spec = load_hf(checkpoints(KIND), load_tensors=False).spec
    assert spec.linear_layers == (True, True, True, False) and spec.attn_output_gate and spec.rope_dim == 4
    assert spec.norm_topk_prob and spec.shared_expert_intermediate_size == 64
    small, large = make_plan(spec, "host", "q8_0", 32), make_plan(spec, "host", "q8_0", 128)
    # Per DeltaNet layer: the convolution's last 3 inputs of q, k, v (2 * 32 + 64 channels) and a
    # 16 x 16 state per value head (4), in floats.
    per_layer = (3 * 128 + 4 * 16 * 16) * 4
    for plan in (small, large):
        assert plan.linear_state_bytes == 3 * per_layer
        assert plan.linear_state_offsets == (0, per_layer // 4, 2 * per_layer // 4, -1)
        assert plan.kv_slots == (0, 0, 0, plan.n_ctx)  # keys and values of the attention layer only
        assert plan.kv_bytes == 2 * plan.n_ctx * spec.kv_dim * 2  # binary16
    assert large.context_state_bytes - small.context_state_bytes == large.kv_bytes - small.kv_bytes
    # report says what the state costs per layer, and that a longer context does not change it.
    assert_report_says_the_state_is_fixed(
        small,
        large,
        "  Gated DeltaNet state: 3 layers x 5,632 B (convolution 1,536 B + delta rule 4,096 B) = 16,896 B, "
        "fixed: it does not grow with the context (counted under kv_cache, beside the KV cache of the 1 "
        "attention layer)",
    )


def assert_report_says_the_state_is_fixed(small, large, line: str) -> None:
    """report's line on the recurrent state is `line` for host plans of a short and a long context
    alike, and its JSON says the state does not grow with the context."""
    host = load_board("host")
    assert [format_report(planned_report(host, p)).splitlines()[1] for p in (small, large)] == [line, line]
    assert planned_report(host, large).to_json()["linear_state"]["grows_with_context"] is False


@pytest.mark.slow  # one firmware build and a run (about 10 s)
def test_a_schedule_of_attention_layers_only_has_no_state_arena_and_decodes_the_reference_bits(builder, tmp_path):
    from models import ORACLE_CONFIGS, make_checkpoint

    config_cls, model_cls, kwargs = ORACLE_CONFIGS[KIND]
    model = make_checkpoint(
        (config_cls, model_cls, dict(kwargs, layer_types=["full_attention"] * 4)), tmp_path / "attention-only"
    )
    art, plan, request, result = builder.run(model, PROMPT, 8, quant="q8_0")
    assert plan.linear_state_bytes == 0 and plan.linear_conv_state_floats == plan.linear_delta_state_floats == 0
    assert compare(result, reference_run(plan, art.weights, request)).passed


@pytest.mark.slow  # two firmware builds and eight runs on host (about 15 s)
@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_host_firmware_decodes_the_reference_bits_greedy_and_sampled_on_one_and_two_threads(
    quant, checkpoints, builder
):
    board, art, plan = builder.build(checkpoints(KIND), quant, 64)
    assert {t.dtype for t in plan.tensors if t.name.endswith("lin_qkv")} == {quant}
    for sampling in (SamplingParams(), SAMPLED):
        for threads in (1, 2):
            request = RunRequest(PROMPT, STEPS, sampling, stop_at_eos=False, threads=threads)
            result = run_on_board(board, art.program, art.weights, request, art.model_hash())
            ref = reference_run(plan, art.weights, request)
            assert compare(result, ref).passed, (sampling, threads)
            assert result.expert_counts == ref.expert_counts
            assert len(result.tokens) == STEPS


@pytest.mark.slow  # one firmware build and runs under a memory budget (about 10 s)
def test_the_expert_cache_decodes_the_same_bits_as_unlimited(checkpoints, builder):
    board, art, plan = builder.build(checkpoints(KIND), "q8_0", 64)
    c = cache_plan(plan, board.budget_reserve, 0).constants

    def run(budget: int, threads: int = 1):
        request = RunRequest(PROMPT, STEPS, SAMPLED, stop_at_eos=False, threads=threads, memory_budget=budget)
        return request, run_on_board(board, art.program, art.weights, request, art.model_hash())

    request, unlimited = run(0)
    assert compare(unlimited, reference_run(plan, art.weights, request)).passed
    for threads in (1, 2):
        _, result = run(c.min_budget, threads)
        assert cache_stats(result).cache_misses > 0  # top-2 slots for 4 MoE layers: really evicting
        assert result.tokens == unlimited.tokens and result.digests == unlimited.digests
        assert result.expert_counts == unlimited.expert_counts


@pytest.mark.slow  # the verify command builds and runs the firmware (about 10 s)
def test_verify_passes_with_q4_0_on_two_threads(checkpoints, tmp_path):
    verify_passes(
        tmp_path / "out", model=checkpoints(KIND), quant="q4_0", ctx=64, prompt_ids=",".join(map(str, PROMPT)),
        steps=12, threads=2, temperature=0.8, seed=3, ignore_eos=True,
    )  # fmt: skip


@pytest.mark.slow  # runs under qemu-aarch64 and qemu-system-riscv32
@pytest.mark.parametrize("board", ["linux-aarch64", "qemu-rv32"])
def test_emulated_boards_decode_the_reference_bits(board, checkpoints, builder):
    art, plan, request, result = builder.run(checkpoints(KIND), PROMPT, 8, quant="q8_0", sampling=SAMPLED, board=board)
    ref = reference_run(plan, art.weights, request)
    assert compare(result, ref).passed
    assert plan.linear_state_bytes > 0 and load_board(board).name == board
