"""./colibri selftest: the firmware's own verdict (the golden vectors in the artifact, no host
reference), built and asked through the same job as run and verify, its checks listed, and an exit
status that a script or a CI gate can use: 0 on PASS, 1 on FAIL."""

from __future__ import annotations

import json

import pytest
from conftest import DEFAULT_MODEL, run_cli

from generator.boards import load_board
from generator.device.session import Selftest
from generator.selftest import kernel_checks, selftest_checks


def selftest_json(capsys, art, board: str, ctx: int) -> tuple[int, dict]:
    """selftest --json in this process on a build the session made already (its --out): status, document."""
    from generator.cli import main

    capsys.readouterr()
    status = main(["selftest", "--board", board, "--ctx", str(ctx), "--out", str(art.out_dir), "--json"])
    return status, json.loads(capsys.readouterr().out)


def test_host_firmware_passes_its_selftest_with_every_check_listed(builder, capsys):
    board, art, plan = builder.build(DEFAULT_MODEL, ctx=64)
    status, doc = selftest_json(capsys, art, "host", 64)
    assert status == 0 and doc["pass"] is True
    assert [c["name"] for c in doc["checks"]] == ["weight image", "kernels", "golden decode"]
    assert all(c["pass"] and c["differed"] == "" for c in doc["checks"])
    # the kernels the firmware counted are the ones the command names
    assert doc["frame"]["kernels_checked"] == str(len(kernel_checks(plan)))
    assert "matvec_q8_0" in doc["checks"][1]["checked"] and "attention_mix_f16" in doc["checks"][1]["checked"]
    assert f"{board.selftest.steps} steps" in doc["checks"][2]["checked"]


def test_a_refused_image_fails_the_image_check_and_the_decode_is_said_not_run(builder):
    _, _, plan = builder.build(DEFAULT_MODEL, ctx=64)
    frame = Selftest(
        False, {"result": "fail", "kernels_checked": "11", "steps": "0", "image": "tensor data CRC-32 mismatch"}
    )
    image, kernels, decode = selftest_checks(frame, plan, 4)
    assert (image.passed, image.differed) == (False, "tensor data CRC-32 mismatch")
    assert kernels.passed
    assert not decode.passed and "not run" in decode.differed


@pytest.mark.slow
@pytest.mark.parametrize(("board", "ctx"), [("qemu-rv32", 64), ("linux-aarch64", 128)])
def test_emulated_boards_pass_their_selftest(builder, capsys, board, ctx):
    """On the emulators (the builds the session shares with the other tests of these boards)."""
    _, art, plan = builder.build(DEFAULT_MODEL, ctx=ctx, board=board)
    status, doc = selftest_json(capsys, art, board, ctx)
    assert status == 0 and doc["pass"] is True and doc["board"] == board
    assert all(c["pass"] for c in doc["checks"])
    assert doc["frame"]["kernels_checked"] == str(len(kernel_checks(plan)))


@pytest.mark.slow
def test_a_board_file_with_fused_multiply_adds_fails_its_selftest_with_exit_status_1(tmp_path):
    """A copy of host.toml kept outside the repository, with the compiler's contraction of a * b + c
    into fused multiply-adds turned on (-ffp-contract=fast -mfma), a board file a user could write:
    the firmware's logits differ from the golden ones by itself. Slow: it compiles a firmware with
    its own flags (about a minute), nothing else in the suite builds."""
    text = load_board("host").path.read_text()
    assert '"-ffp-contract=off"' in text
    fused = tmp_path / "host-fused.toml"
    fused.write_text(
        text.replace('name = "host"', 'name = "host-fused"').replace(
            '"-ffp-contract=off"', '"-ffp-contract=fast", "-mfma"'
        )
    )
    done = run_cli("selftest", "--board", fused, "--ctx", "64", "--out", tmp_path / "build")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("host-fused: self-test FAIL: golden decode step ")
    assert "logits SHA-256 differs" in lines[-1]
    assert any(line.startswith("  FAIL golden decode: ") for line in lines)
    assert any(line.startswith("  ok   weight image: ") for line in lines)
