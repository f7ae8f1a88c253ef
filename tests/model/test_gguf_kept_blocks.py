"""--quant gguf with the block types kept verbatim (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K,
IQ4_NL, IQ4_XS, MXFP4): the image holds the file's blocks as they are, the plan and report say each
tensor's type, and the firmware decodes the reference's bits on host, linux-aarch64 and qemu-rv32,
and through the expert cache's slots."""

import json

import numpy as np
import pytest
from cli_runs import verify_passes
from conftest import run_cli
from gguf_files import hf_to_gguf

from generator.compile.image import map_image, read_header
from generator.compile.layout import TensorEntry
from generator.model.gguf.load import load_gguf
from generator.numerics import blocks
from models import ORACLE_CONFIGS, make_checkpoint

pytestmark = pytest.mark.slow  # builds and verifies every kept type on host and the emulated boards

# Rows of 256 and 512 values: whole superblocks for every type.
WIDE_LLAMA = (
    "LlamaConfig",
    "LlamaForCausalLM",
    dict(ORACLE_CONFIGS["llama_gqa_linear"][2], hidden_size=256, intermediate_size=512, num_attention_heads=4),
)
# Every kept type at least once, the embedding in an affine type, lm_head in one with two scales.
MIXED = {
    "token_embd.weight": "Q5_K",
    "output.weight": "Q3_K",
    "blk.0.attn_q.weight": "Q4_K",
    "blk.0.attn_k.weight": "Q5_K",
    "blk.0.attn_v.weight": "Q6_K",
    "blk.0.attn_output.weight": "Q5_0",
    "blk.0.ffn_gate.weight": "Q5_1",
    "blk.0.ffn_up.weight": "Q3_K",
    "blk.0.ffn_down.weight": "Q2_K",
    "blk.1.attn_q.weight": "IQ4_NL",
    "blk.1.attn_k.weight": "IQ4_XS",
    "blk.1.attn_v.weight": "MXFP4",
    "blk.1.attn_output.weight": "Q2_K",
    "blk.1.ffn_gate.weight": "Q6_K",
    "blk.1.ffn_up.weight": "Q4_K",
    "blk.1.ffn_down.weight": "Q5_0",
}
# The MoE test model's rows are 64 and 96 values: the types of 32-value blocks; MXFP4 (gpt-oss's
# experts' type) in experts of both layers and in the embedding.
MOE_TYPES = {
    "token_embd.weight": "MXFP4",
    "blk.0.ffn_gate_exps.weight": "Q5_0",
    "blk.0.ffn_up_exps.weight": "IQ4_NL",
    "blk.0.ffn_down_exps.weight": "MXFP4",
    "blk.1.ffn_gate_exps.weight": "IQ4_NL",
    "blk.1.ffn_up_exps.weight": "Q5_1",
    "blk.1.ffn_down_exps.weight": "MXFP4",
}


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("kept-blocks")
    return hf_to_gguf(make_checkpoint(WIDE_LLAMA, root / "hf"), root / "mixed.gguf", "Q8_0", types=MIXED)


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("kept-blocks-moe")
    config = ORACLE_CONFIGS["mixtral_moe"]
    config = (config[0], config[1], dict(config[2], sliding_window=None))
    return hf_to_gguf(make_checkpoint(config, root / "hf"), root / "moe.gguf", "Q8_0", types=MOE_TYPES)


def build(path, out):
    done = run_cli("build", "--board", "host", "--model", path, "--quant", "gguf", "--ctx", "64", "--out", out)
    assert done.returncode == 0, done.stderr
    return out / "generated", done.stderr


def test_the_image_holds_the_files_blocks_and_the_plan_says_their_types(mixed_gguf, tmp_path):
    generated, stderr = build(mixed_gguf, tmp_path / "out")
    plan = json.loads((generated / "plan.json").read_text())
    assert plan["gguf"]["quantized_again"] == [] and len(plan["gguf"]["exact"]) == len(plan["tensors"])
    checkpoint = load_gguf(mixed_gguf)
    image = map_image(generated / "weights.img")
    base = read_header(image).data_offset
    seen = set()
    for entry in plan["tensors"]:
        t = TensorEntry(**entry)
        file_type = plan["gguf"]["file_types"][t.name]
        if file_type not in blocks.BY_GGUF:
            continue
        assert t.dtype == blocks.BY_GGUF[file_type] and t.nbytes == t.rows * blocks.row_bytes(t.dtype, t.cols)
        seen.add(t.dtype)
        held = np.asarray(image[base + t.offset : base + t.offset + t.nbytes])
        # the file's bytes (rows in canonical order), and the same values as the file's
        assert np.array_equal(held, checkpoint.blocks(t.name).block_bytes()), t.name
        values = blocks.dequantize(t.dtype, blocks.rows_of(t.dtype, held, t.cols))
        file_values = checkpoint.tensors[t.name].load().reshape(-1)
        assert np.array_equal(values.view(np.uint32), file_values.view(np.uint32)), t.name
    assert seen == set(blocks.FORMATS)
    assert "Q4_K as q4_k" in plan["gguf"]["summary"] and "quantized again" not in plan["gguf"]["summary"]
    assert "tensors kept exactly as the GGUF file holds them" in stderr
    header = (generated / "model_def.h").read_text()
    assert "#define COLIBRI_READS_Q4_K 1" in header and "#define COLIBRI_Q6_K_BLOCK_BYTES 210" in header
    assert "layers.0.wv: whole q6_k blocks, row after row" in header


def test_the_image_is_the_files_tensor_bytes_plus_alignment(mixed_gguf, tmp_path):
    generated, _ = build(mixed_gguf, tmp_path / "out")
    plan = json.loads((generated / "plan.json").read_text())
    gguf = load_gguf(mixed_gguf).gguf
    file_bytes = sum(info.end - info.begin for info in gguf.tensors.values())
    data_bytes = plan["image"]["data_bytes"]
    assert file_bytes <= data_bytes <= file_bytes + 64 * len(plan["tensors"])


def test_report_names_each_type(mixed_gguf, tmp_path):
    done = run_cli("report", "--model", mixed_gguf, "--quant", "gguf", "--ctx", "64", "--out", tmp_path / "o", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)["gguf"]["summary"]
    for f in blocks.FORMATS.values():
        assert f"{f.ggml_type} as {blocks.BY_GGUF[f.ggml_type]}" in summary


@pytest.mark.parametrize("board", ["host", "linux-aarch64", "qemu-rv32"])
def test_kept_blocks_decode_as_the_reference_on_every_board(mixed_gguf, tmp_path, board):
    verify_passes(
        tmp_path / "out", timeout=900, board=board, model=mixed_gguf, quant="gguf", ctx=64, prompt_ids="1,5,9,30",
        steps=6, temperature=0.8, seed=3, ignore_eos=True,
    )  # fmt: skip


def test_kept_blocks_decode_as_the_reference_on_aarch64_without_sdot(mixed_gguf, tmp_path, monkeypatch):
    """linux-aarch64 on a core without the dot-product extension (qemu-aarch64 -cpu cortex-a72, as
    a Raspberry Pi 4): the arm_neon set's plain NEON path, rows split over three threads."""
    monkeypatch.setenv("QEMU_CPU", "cortex-a72")
    verify_passes(
        tmp_path / "out", timeout=900, board="linux-aarch64", model=mixed_gguf, quant="gguf", ctx=64,
        prompt_ids="1,5,9,30", steps=6, threads=3, ignore_eos=True,
    )  # fmt: skip


def test_kept_expert_blocks_read_into_the_cache_slots_decode_the_same_bits(builder, moe_gguf):
    from generator.compile.cache_plan import cache_plan
    from generator.device.runner import run_on_board
    from generator.device.session import RunRequest, cache_stats
    from generator.verify import compare, reference_run

    def run(budget: int):
        request = RunRequest([1, 5, 9, 33, 7, 12], 24, memory_budget=budget, stop_at_eos=False)
        return request, run_on_board(board, art.program, art.weights, request, art.model_hash())

    board, art, plan = builder.build(moe_gguf, "gguf", 64)
    assert {t.dtype for t in plan.tensors if ".experts." in t.name} == {"q5_0", "q5_1", "iq4_nl", "mxfp4"}
    assert next(t.dtype for t in plan.tensors if t.name == "embed") == "mxfp4"
    request, unlimited = run(0)
    assert compare(unlimited, reference_run(plan, art.weights, request)).passed
    _, result = run(cache_plan(plan, board.budget_reserve, 0).constants.min_budget)
    assert cache_stats(result).cache_misses > 0
    assert result.tokens == unlimited.tokens and result.digests == unlimited.digests


@pytest.mark.parametrize("board", ["host", "linux-aarch64"])
def test_gemma3_270m_q4_k_m_keeps_every_tensor_and_decodes_the_references_bits(tmp_path, board):
    """The real file (81 Q5_0, 9 Q6_K, 27 Q4_K, 10 Q8_0 and 109 F32 tensors): nothing quantized
    again, and the firmware's logits are the reference's at every step: on host (AVX2) and on
    linux-aarch64 (NEON with SDOT, under qemu-aarch64; rows split over two threads)."""
    from gguf_files import gemma3_gguf

    path = gemma3_gguf()
    out = tmp_path / "out"
    args = ["--board", board, "--model", path, "--quant", "gguf", "--ctx", "64", "--out", out]
    if board == "linux-aarch64":
        args += ["--threads", "2"]
    done = run_cli(
        "verify", *args, "--prompt-ids", "2,9259,1902", "--steps", "4", "--ignore-eos", "--json", timeout=1500
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pass"]
    plan = json.loads((out / "generated" / "plan.json").read_text())
    assert plan["gguf"]["quantized_again"] == [] and len(plan["gguf"]["exact"]) == 236
    kept = {t["dtype"] for t in plan["tensors"]}
    assert {"q5_0", "q6_k", "q4_k", "q8_0", "f32"} == kept
