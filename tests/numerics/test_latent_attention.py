"""Multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash): the cache holds one row per position
and layer, the latent and the RoPE key, which the plan, model_def.h and report count; the absorbed
decode gives the reference's bits on the emulated boards, whatever the KV type (transformers'
greedy tokens in f32 and the q8_0 bits on host: test_oracle.py)."""

from __future__ import annotations

import pytest
from cli_runs import assert_decodes_as_the_reference, run_prompt

from generator.boards import load_board
from generator.compile.plan import make_plan
from generator.model.hf.load import load_hf
from generator.numerics.sampling import SamplingParams
from generator.report import planned_report

PROMPT = [1, 17, 42, 99, 7, 3, 250, 64]
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)


def test_the_cache_keeps_the_latent_and_the_rope_key_per_position_and_layer(checkpoints):
    spec = load_hf(checkpoints("deepseek_v3_mla"), load_tensors=False).spec
    row = spec.kv_lora_rank + spec.rope_dim  # 48 + 16
    for kv_type, per_value in (("f32", 4), ("f16", 2), ("q8_0", 1 + 2 / 32)):
        plan = make_plan(spec, "host", "q8_0", 128, kv_type=kv_type)
        assert plan.kv_bytes_per_position == spec.n_layers * row * per_value
        assert plan.kv_bytes == 128 * plan.kv_bytes_per_position  # no V arena: nothing else is cached
        assert plan.value_arena_values == 0
    # Plain attention of the same heads would cache keys and values of every head: 2 x 4 x 32.
    assert plan.spec.n_heads * plan.spec.head_dim * 2 > row


def test_model_def_and_report_show_the_cache_bytes_per_position(checkpoints, builder):
    board, art, plan = builder.build(checkpoints("glm4_moe_lite_mla"), "q8_0", 64)
    model_def = (art.generated / "model_def.h").read_text()
    assert f"#define COLIBRI_KV_BYTES_PER_POSITION {plan.kv_bytes_per_position}ull" in model_def
    assert "#define COLIBRI_KV_LORA_RANK 32 " in model_def and "#define COLIBRI_KV_V_VALUES 0ull" in model_def
    report = planned_report(load_board("esp32p4-idf"), plan).to_json()
    rows = {r["kv_type"]: r for r in report["kv_types"]}
    assert rows["f32"]["bytes_per_position"] == plan.spec.n_layers * (32 + 32) * 4


@pytest.mark.slow  # runs under qemu-aarch64 (two threads) and qemu-system-riscv32
@pytest.mark.parametrize(
    "kind, quant, board, kv_type",
    [
        ("deepseek_v3_mla", "q4_0", "linux-aarch64", "q8_0"),
        ("deepseek_v2_mla", "q8_0", "qemu-rv32", None),
        ("glm4_moe_lite_mla", "q8_0", "host", "f16"),
    ],
)
def test_emulated_boards_decode_the_reference_bits(kind, quant, board, kv_type, checkpoints, builder):
    b, art, plan = builder.build(checkpoints(kind), quant, 32, board, kv_type)
    request, result = run_prompt(b, art, PROMPT, 8, SAMPLED, 2 if board == "linux-aarch64" else 1, 0)
    assert result.hello["board"] == board
    assert_decodes_as_the_reference(plan, art, request, result)
    assert len(result.tokens) == request.steps


def test_report_says_the_longest_context_the_psram_holds_against_plain_attention(checkpoints):
    """report --board esp32p4-idf: the latent cache's bytes a position against plain attention's of the
    same heads (keys of qk_nope + qk_rope, values of v_head_dim, every head), and the longest context
    each leaves room for."""
    from generator.compile.plan import plan_for_board
    from generator.report import format_report

    board = load_board("esp32p4-idf")
    plan = plan_for_board(load_hf(checkpoints("deepseek_v3_mla"), load_tensors=False).spec, board, "q8_0", 128)
    rep = planned_report(board, plan)
    s = plan.spec
    latent = rep.latent_cache
    assert latent["bytes_per_position"] == s.n_layers * (s.kv_lora_rank + s.rope_dim) * 2  # f16, the board's
    assert latent["plain_bytes_per_position"] == s.n_layers * s.n_heads * (s.head_dim + s.v_head_dim) * 2
    assert latent["plain_largest_ctx_that_fits"] <= latent["largest_ctx_that_fits"] == rep.largest_ctx_that_fits
    assert latent["summary"] in format_report(rep) and rep.to_json()["latent_cache"] == latent
