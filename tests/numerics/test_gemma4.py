"""Gemma 4's text model (tests/models.py "gemma4_text": sliding layers of window 4 and global layers
with wider heads, one KV head, keys equal to values and proportional RoPE, per-layer inputs;
"gemma4_moe": the MoE block of 8 experts top-2 beside the dense FFN; "gemma4_kv_shared": the last
two layers attending over earlier layers' keys and values, with FFNs twice as wide): the plan keeps the per-layer
input table in the image, and the firmware decodes the reference's bits (tokens and every step's
logits SHA-256) with q8_0 and q4_0, greedy and sampled, on 1 and 2 threads, under a memory budget,
and on the emulated boards. tests/numerics/test_oracle.py checks the f32 firmware against
transformers and q8_0 against the reference for both."""

from __future__ import annotations

import json

import pytest
from cli_runs import assert_decodes_as_the_reference, run_prompt, verify_passes

from generator.boards import load_board
from generator.compile.cache_plan import cache_plan
from generator.compile.plan import make_plan
from generator.device.session import cache_stats
from generator.model.hf.load import load_hf
from generator.numerics.sampling import SamplingParams
from generator.report import format_report, planned_report
from generator.verify import reference_run

PROMPT = [1, 17, 42, 99, 7, 3, 250, 64]  # longer than the sliding window (4)
STEPS = 12
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)


def test_global_layers_have_their_own_widths_and_the_per_layer_table_stays_in_the_image(checkpoints):
    spec = load_hf(checkpoints("gemma4_text"), load_tensors=False).spec
    assert spec.layer_windows == (4, 4, 0, 4, 4, 0) and spec.k_eq_v and spec.v_norm and spec.layer_scalars
    assert [spec.layer_head_dim(i) for i in range(6)] == [16, 16, 32, 16, 16, 32]
    assert [spec.layer_kv_heads(i) for i in range(6)] == [2, 2, 1, 2, 2, 1]
    assert spec.rope.scaling == "proportional" and spec.rope.rotated_fraction == 0.25 and spec.attn_scale == 1.0
    plan = make_plan(spec, "host", "q8_0", 64)
    # KV cache: sliding layers keep their window of 2 x 16 values, global ones the context of 1 x 32.
    assert plan.kv_slots == (4, 4, 64, 4, 4, 64)
    assert plan.kv_bytes == 2 * 2 * (4 * (4 * 32) + 2 * (64 * 32))  # K and V, binary16 (the default cache)
    # Two RoPE tables: the sliding layers' (8 pairs) and the global layers' (16 pairs, of which
    # int(0.25 * 32 / 2) = 4 rotate); rows hold the wider one's 16.
    assert plan.rope_dims == (16, 32) and plan.layer_rope == (0, 0, 1, 0, 0, 1)
    assert plan.rope_table_bytes == 2 * 2 * 64 * 16 * 4
    names = {t.name for t in plan.tensors}
    assert "layers.2.wv" not in names and "layers.0.wv" in names  # global layers: values are the keys
    table = plan.paged_table
    assert (table.name, table.dtype, table.rows, table.cols) == ("ple_embed", "q8_0", 262, 6 * 32)
    # The table is weights (in the image), never counted as resident under a memory budget.
    c = cache_plan(plan, 0, 0).constants
    assert c.resident_bytes == plan.image.image_bytes - table.nbytes
    line = format_report(planned_report(load_board("host"), plan)).splitlines()[1]
    assert line == (
        f"  per-layer inputs: ple_embed q8_0 [262 x 192] = {table.nbytes:,} B in the weight image, one row of "
        f"{table.nbytes // 262:,} B read per token (not in RAM: never held under a memory budget)"
    )
    assert make_plan(spec, "qemu-rv32", "q8_0", 32).paged_table.nbytes == table.nbytes


def test_kv_sharing_layers_hold_no_cache_and_read_their_sources(checkpoints):
    spec = load_hf(checkpoints("gemma4_kv_shared"), load_tensors=False).spec
    assert spec.kv_shared_layers == 2 and spec.double_wide_mlp and not spec.k_eq_v
    assert [spec.kv_source(i) for i in range(6)] == [0, 1, 2, 3, 3, 2]
    assert [spec.layer_ffn_dim(i) for i in range(6)] == [64, 64, 64, 64, 128, 128]
    plan = make_plan(spec, "host", "q8_0", 64)
    assert plan.kv_slots == (4, 4, 64, 4, 0, 0)  # layers 4 and 5 keep nothing of their own
    assert plan.kv_offsets[4] == plan.kv_offsets[3] and plan.kv_offsets[5] == plan.kv_offsets[2]
    assert plan.kv_bytes == 2 * 2 * (3 * 4 * (2 * 16) + 64 * (2 * 32))  # binary16
    names = {t.name for t in plan.tensors}
    assert {"layers.4.wk", "layers.4.wv", "layers.4.k_norm", "layers.5.wk"}.isdisjoint(names)
    assert plan.tensor("layers.4.w_gate").rows == 128 and plan.tensor("layers.3.w_gate").rows == 64


def test_proportional_rope_has_transformers_frequencies():
    """The global layers' RoPE: the first quarter of the pairs rotate, the rest have frequency 0."""
    import numpy as np
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from generator.numerics import rope
    from models import ORACLE_CONFIGS

    config = transformers.Gemma4TextConfig(**ORACLE_CONFIGS["gemma4_text"][2])
    theirs, _ = ROPE_INIT_FUNCTIONS["proportional"](config, layer_type="full_attention")
    spec_rope = load_rope(config)
    ours = rope.inverse_frequencies(spec_rope, 32)
    assert np.count_nonzero(ours) == 4 and np.allclose(ours, theirs.numpy(), rtol=1e-6, atol=0)


def test_without_rope_parameters_the_ropes_are_transformers_defaults(checkpoints):
    from generator.model.hf.load import parse_config

    data = json.loads((checkpoints("gemma4_text") / "config.json").read_text())
    del data["rope_parameters"]
    spec = parse_config(data, "gemma4")
    assert (spec.rope.scaling, spec.rope.theta, spec.rope.rotated_fraction) == ("proportional", 1e6, 0.25)
    assert (spec.rope_local.scaling, spec.rope_local.theta) == ("default", 10000.0)


def load_rope(config):
    from generator.model.hf.load import parse_config

    data = dict(config.to_dict(), architectures=["Gemma4ForCausalLM"])
    return parse_config(data, "gemma4").rope


def test_the_moe_block_keeps_the_dense_ffn_beside_the_experts(checkpoints):
    spec = load_hf(checkpoints("gemma4_moe"), load_tensors=False).spec
    assert spec.moe_beside_dense and spec.norm_topk_prob and spec.n_experts == 8 and spec.experts_per_token == 2
    assert spec.moe_layers == (True,) * 4 and not spec.ple_dim
    plan = make_plan(spec, "host", "q8_0", 64)
    names = [t.name for t in plan.tensors if t.name.startswith("layers.0.")]
    for part in ("w_gate", "post_dense_norm", "router_norm", "router", "expert_scale", "moe_norm", "post_moe_norm"):
        assert f"layers.0.{part}" in names
    assert plan.paged_table is None


def run(board, art, sampling=SamplingParams(), threads=1, budget=0, steps=STEPS):
    return run_prompt(board, art, PROMPT, steps, sampling, threads, budget)


def assert_verified(plan, art, request, result, ref=None):
    assert_decodes_as_the_reference(plan, art, request, result, ref)
    assert len(result.tokens) == request.steps


@pytest.mark.slow  # five firmware builds and twenty runs on host (about 40 s)
@pytest.mark.parametrize(
    "kind, quant",
    [
        ("gemma4_text", "q8_0"),
        ("gemma4_text", "q4_0"),
        ("gemma4_moe", "q8_0"),
        ("gemma4_moe", "q4_0"),
        ("gemma4_kv_shared", "q4_0"),  # (its q8_0 bits: test_oracle.py)
    ],
)
def test_host_firmware_decodes_the_reference_bits_greedy_and_sampled_on_one_and_two_threads(
    kind, quant, checkpoints, builder
):
    board, art, plan = builder.build(checkpoints(kind), quant, 64)
    assert {t.dtype for t in plan.tensors if t.name.endswith(".wk")} == {quant}
    for sampling in (SamplingParams(), SAMPLED):
        ref = None  # the reference does not depend on the thread count
        for threads in (1, 2):
            request, result = run(board, art, sampling, threads)
            ref = ref or reference_run(plan, art.weights, request)
            assert_verified(plan, art, request, result, ref)


@pytest.mark.slow  # one firmware build and runs under a memory budget (about 10 s)
def test_the_expert_cache_decodes_the_same_bits_as_unlimited(checkpoints, builder):
    board, art, plan = builder.build(checkpoints("gemma4_moe"), "q8_0", 64)
    c = cache_plan(plan, board.budget_reserve, 0).constants
    request, unlimited = run(board, art, SAMPLED)
    assert_verified(plan, art, request, unlimited)
    for threads in (1, 2):
        _, result = run(board, art, SAMPLED, threads, budget=c.min_budget)
        stats = cache_stats(result)
        assert stats.slots == c.experts_per_token < c.max_slots and stats.cache_misses > 0
        assert result.tokens == unlimited.tokens and result.digests == unlimited.digests
        assert result.expert_counts == unlimited.expert_counts


@pytest.mark.slow  # the q8_0 build of the test above, run under a memory budget (about 5 s)
def test_under_a_budget_the_per_layer_table_is_read_in_place_with_the_same_bits(checkpoints, builder):
    board, art, plan = builder.build(checkpoints("gemma4_text"), "q8_0", 64)
    c = cache_plan(plan, board.budget_reserve, 0).constants
    assert c.resident_bytes + plan.paged_table.nbytes == plan.image.image_bytes
    request, unlimited = run(board, art, SAMPLED)
    _, budgeted = run(board, art, SAMPLED, budget=c.min_budget)  # room for the resident part only
    assert budgeted.tokens == unlimited.tokens and budgeted.digests == unlimited.digests
    assert_verified(plan, art, request, budgeted)


@pytest.mark.slow  # the verify command builds and runs the firmware (about 10 s)
def test_verify_passes_with_q4_0_sampled_on_two_threads(checkpoints, tmp_path):
    verify_passes(
        tmp_path / "out", model=checkpoints("gemma4_moe"), quant="q4_0", ctx=64, prompt_ids=",".join(map(str, PROMPT)),
        steps=12, threads=2, temperature=0.8, seed=3, ignore_eos=True,
    )  # fmt: skip


@pytest.mark.slow  # runs under qemu-aarch64 and qemu-system-riscv32
@pytest.mark.parametrize(
    "kind, quant, board",
    [
        ("gemma4_text", "q4_0", "linux-aarch64"),
        ("gemma4_moe", "q8_0", "linux-aarch64"),
        ("gemma4_text", "q8_0", "qemu-rv32"),
        ("gemma4_moe", "q4_0", "qemu-rv32"),
        ("gemma4_kv_shared", "q8_0", "qemu-rv32"),
    ],
)
def test_emulated_boards_decode_the_reference_bits(kind, quant, board, checkpoints, builder):
    b, art, plan = builder.build(checkpoints(kind), quant, 32, board)
    request, result = run(b, art, SAMPLED, threads=2 if board == "linux-aarch64" else 1, steps=8)
    assert result.hello["board"] == board
    assert_verified(plan, art, request, result)


@pytest.mark.slow  # transformers runs the multimodal model; one f32 firmware build
def test_text_tower_of_a_gemma4_multimodal_checkpoint_matches_transformers(builder, tmp_path_factory):
    import numpy as np
    from transformers import Gemma4ForConditionalGeneration

    from models import make_gemma4_multimodal, transformers_logits

    model_dir = make_gemma4_multimodal(tmp_path_factory.mktemp("gemma4mm") / "model")
    logits_file = tmp_path_factory.mktemp("gemma4mm-logits") / "logits.f32"
    art, plan, request, result = builder.run(model_dir, PROMPT, 10, quant="f32", logits_out=logits_file)
    assert plan.spec.architecture == "Gemma4ForConditionalGeneration" and plan.spec.ple_dim == 32
    fw = np.fromfile(logits_file, dtype="<f4").reshape(10, plan.spec.vocab_size)
    hf = transformers_logits(Gemma4ForConditionalGeneration, model_dir, PROMPT, result.tokens)
    assert np.abs(fw - hf).max() <= 1e-4 * np.abs(hf).max()
    assert list(np.argmax(hf, axis=1)) == result.tokens
