"""The self-test inside the firmware (firmware_src/app/selftest.c): every kernel of the board's set
against the scalar one, and a greedy decode of the golden prompt whose tokens and logits SHA-256 the
NumPy reference computed at build time. A good build says PASS by itself; a firmware given a weight
image damaged on purpose says FAIL by itself, naming why — on host (a selftest request) and on
qemu-rv32 (at boot, and on a selftest request)."""

from __future__ import annotations

import re

import pytest
from conftest import DEFAULT_MODEL

from generator.boards import load_board
from generator.compile.build import prepare, run_scons
from generator.compile.pipeline import SELFTEST_DATA_FILE
from generator.device.runner import run_on_board
from generator.device.session import RunRequest
from generator.errors import ColibriError
from generator.selftest import CHECKABLE, checked_types, golden_run

SELFTEST = RunRequest([], 0, selftest=True)


def damaged(weights, tmp_path):
    """The image with one bit of its tensor data flipped (the loader's CRC-32s catch it)."""
    blob = bytearray(weights.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    path = tmp_path / "damaged.img"
    path.write_bytes(bytes(blob))
    return path


def test_the_golden_vectors_in_the_firmware_are_the_references(builder):
    board, art, plan = builder.build(DEFAULT_MODEL, ctx=64)
    golden = golden_run(plan, art.weights, board)
    text = (art.weights.parent / SELFTEST_DATA_FILE).read_text()
    assert f"{{ {', '.join(map(str, golden.tokens))} }}" in text
    for digest in golden.c_digests():
        assert digest in text
    assert len(golden.tokens) == board.selftest.steps and len(golden.prompt) == board.selftest.prompt_tokens


def test_host_firmware_passes_its_selftest_and_fails_on_a_damaged_image(builder, tmp_path):
    board, art, plan = builder.build(DEFAULT_MODEL, ctx=64)
    good = run_on_board(board, art.program, art.weights, SELFTEST, art.model_hash())
    assert good.selftest is not None and good.selftest.passed, good.selftest
    # f32 and q8_0 products (one token, batched), activation quantization (quants, scales), SwiGLU,
    # attention scores and mix, over a float32 tile and over a binary16 one read in place; and both
    # products of every other block type the model uses.
    assert int(good.selftest.fields["kernels_checked"]) == 11 + 2 * sum(checked_types(plan).values())
    assert good.selftest.fields["steps"] == str(board.selftest.steps)
    assert good.stop_reason == "selftest" and good.tokens == []

    bad = run_on_board(board, art.program, damaged(art.weights, tmp_path), SELFTEST, art.model_hash())
    assert bad.selftest is not None and not bad.selftest.passed
    assert "CRC-32" in bad.selftest.fields["image"]
    assert bad.selftest.line().startswith("self-test FAIL: weight image refused")


@pytest.mark.slow
def test_qemu_rv32_runs_its_selftest_at_boot_and_fails_by_itself_on_a_damaged_image(builder, tmp_path):
    board, art, plan = builder.build(DEFAULT_MODEL, ctx=64, board="qemu-rv32")
    assert board.selftest.boot
    good = run_on_board(board, art.program, art.weights, SELFTEST, art.model_hash(), flash_image=art.flash_image)
    # The boot run's frame, then the request's: both PASS, with the exact instructions the run cost.
    assert good.selftest is not None and good.selftest.passed
    assert int(good.selftest.fields["instret"]) > 0

    with pytest.raises(ColibriError) as failed:
        run_on_board(
            board, art.program, art.weights, SELFTEST, art.model_hash(), flash_image=damaged(art.weights, tmp_path)
        )
    assert re.search(r"error 17: .*\(self-test FAIL: weight image refused: .*CRC-32", str(failed.value))


@pytest.mark.slow
@pytest.mark.parametrize("board_name", ["host", "linux-aarch64"])
def test_every_kernel_matches_the_scalar_one_and_a_decode_that_differs_names_the_step(board_name, tmp_path):
    """A test build checking every block type (COLIBRI_SELFTEST_CHECK_ALL), not only the model's:
    the board's SIMD set (AVX2; NEON with SDOT under qemu-aarch64) against the scalar kernels, all
    equal. The same build sees step 2's logits differ (COLIBRI_TEST_SELFTEST_DAMAGE_STEP, as a wrong
    forward pass would): FAIL, naming the step, its token the expected one, its logits different."""
    board = load_board(board_name)
    req, plan = prepare(board, DEFAULT_MODEL, "q8_0", 64, tmp_path / "build")
    art = run_scons(req, defines=("COLIBRI_SELFTEST_CHECK_ALL", "COLIBRI_TEST_SELFTEST_DAMAGE_STEP=2"))
    result = run_on_board(board, art.program, art.weights, SELFTEST, art.model_hash())
    test = result.selftest
    assert test is not None and "kernel_failed" not in test.fields
    assert test.fields["kernels_checked"] == str(12 + 2 * len(CHECKABLE))  # 12: GeGLU's among them
    assert not test.passed and test.fields["step"] == "2" and test.fields["logits"] == "differ"
    assert "golden decode step 2" in test.line() and "logits SHA-256 differs" in test.line()
