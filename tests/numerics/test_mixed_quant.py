"""A q8_0, q4_0 or q4_1 model with a few matrices whose rows are not whole blocks: those stay f32, the
build and `report` say which, and every board still decodes the reference's bits."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from generator.numerics.sampling import SamplingParams
from generator.reference import Reference

pytestmark = pytest.mark.slow  # builds mixed-quantization firmware on several boards

PROMPT = [1, 17, 33, 90, 5]
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=3)


@pytest.mark.parametrize(
    "board,quant",
    [
        ("host", "q4_0"),
        ("linux-aarch64", "q8_0"),
        ("linux-aarch64", "q4_0"),
        ("qemu-rv32", "q8_0"),
        ("qemu-rv32", "q4_0"),
        ("host", "q4_1"),
        ("linux-aarch64", "q4_1"),
        ("qemu-rv32", "q4_1"),
    ],
)
def test_kept_f32_matrices_decode_the_reference_bits_on_every_board(board, quant, checkpoints, builder):
    model = checkpoints("qwen3_moe_odd_experts")
    art, plan, request, result = builder.run(model, PROMPT, 16, quant=quant, sampling=SAMPLED, board=board)
    assert plan.kept_f32 and all(".w_down" in name for name in plan.kept_f32)
    ref = Reference(plan, art.weights.read_bytes()).generate(PROMPT, 16, SAMPLED, stop_at_eos=False)
    assert result.tokens == ref.tokens
    assert result.digests == ref.digests
    assert result.expert_counts == ref.expert_counts


def test_build_and_report_say_which_matrices_stay_f32(checkpoints, tmp_path):
    model = checkpoints("qwen3_moe_odd_experts")
    out = tmp_path / "out"
    done = run_cli("build", "--model", model, "--ctx", "64", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "note: 8 matrices kept in f32" in done.stderr and "layers.*.experts.*.w_down" in done.stderr
    header = (out / "generated" / "model_def.h").read_text()
    assert "8 matrices have rows that are not whole blocks of 32 and stay f32" in header
    assert "/*   layers.1.experts.3.w_down */" in header
    done = run_cli("report", "--model", model, "--ctx", "64", "--out", out, "--json")
    assert done.returncode == 0, done.stderr
    kept = json.loads(done.stdout)["kept_f32"]
    assert len(kept["tensors"]) == 8 and kept["bytes"] == 8 * 64 * 48 * 4
    assert all(size == 64 * 48 * 4 for size in kept["tensors"].values())
    text = run_cli("report", "--model", model, "--ctx", "64", "--out", out).stdout
    assert "8 matrices kept in f32 (98,304 B; rows of 48 are not whole blocks of 32)" in text
