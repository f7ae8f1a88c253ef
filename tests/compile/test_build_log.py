"""A build's log says what happens once (no esptool warnings, no raw SCons actions, no line per
tensor), and the esp32p4 image the ROM loads carries the build id its hello frame reports."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, run_cli
from esptool.bin_image import LoadFirmwareImage

from generator.compile.build import progress_line
from generator.compile.firmware_id import elf_build_id
from generator.compile.pipeline import QuantizeProgress


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.slow
def test_esp32p4_build_log_is_quiet_and_the_image_carries_the_build_id(tmp_path):
    out = tmp_path / "p4"
    done = run_cli("build", "--board", "esp32p4", "--out", out)
    assert done.returncode == 0, done.stderr
    log = done.stderr
    assert "Unknown section type" not in log and "WARNING" not in log, log
    assert "Mkdir(" not in log, log
    assert len([line for line in log.splitlines() if "quantiz" in line]) == 1, log

    build_id = elf_build_id(out / "firmware.elf")
    assert build_id and len(build_id) == 40  # sha1
    note = bytes.fromhex("040000001400000003000000") + b"GNU\0" + bytes.fromhex(build_id)
    image = LoadFirmwareImage("esp32p4", str(out / "firmware.bin"))
    # The ROM loads only the image's segments: the note the firmware reads must be in one of them.
    assert any(note in segment.data for segment in image.segments)


def test_quantizing_progress_is_time_based():
    lines = []
    now = [0.0]
    report = QuantizeProgress(lines.append, clock=lambda: now[0])
    for i in range(1, 39):
        report(i, 38, i * 1000, 38_000)
    assert lines == []  # a small model: nothing beyond the opening line the caller prints
    for i in range(1, 11):
        now[0] += 1.5
        report(i, 1000, i * 1_000_000, 1000 * 1_000_000)
    # tensors, bytes, and the time left at the rate so far (1 MB per 1.5 s: 998 MB in 1497 s)
    assert lines == [
        "quantizing weights: 2/1000 tensors, 2.0 MB of 1,000.0 MB, 1497 s left",
        "quantizing weights: 4/1000 tensors, 4.0 MB of 1,000.0 MB, 1494 s left",
        "quantizing weights: 6/1000 tensors, 6.0 MB of 1,000.0 MB, 1491 s left",
        "quantizing weights: 8/1000 tensors, 8.0 MB of 1,000.0 MB, 1488 s left",
        "quantizing weights: 10/1000 tensors, 10.0 MB of 1,000.0 MB, 1485 s left",
    ]


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.slow
def test_plain_scons_defaults_to_the_bundled_model(tmp_path):
    """`scons board=host` without model= builds the default model, as ./colibri does (dry run)."""
    scons = REPO / ".venv" / "bin" / "scons"
    scons = scons if scons.exists() else __import__("pathlib").Path(sys.executable).parent / "scons"
    out = tmp_path / "direct"
    done = subprocess.run(
        [str(scons), "-n", "-Q", "-C", str(REPO), "board=host", f"out={out}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "colibri: error" not in done.stderr
    assert f"{out}/generated" in done.stdout + done.stderr


def test_a_build_refused_in_generation_says_one_line(checkpoints, tmp_path):
    """Weights refused while the image is generated (inside SCons): the one error line, last,
    without NumPy's warnings or SCons's own lines before it. Progress lines come before it only
    when the build ran past PROGRESS_HOLD_SECONDS first (the image is made while the runtime
    compiles: on an empty build cache, or a busy machine, it does)."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(checkpoints("qwen2_bias"), model)
    tensors = load_file(model / "model.safetensors")
    norm = tensors["model.norm.weight"].copy()
    norm[0] = np.inf
    tensors["model.norm.weight"] = norm
    save_file(tensors, model / "model.safetensors")
    done = run_cli("build", "--model", model, "--out", tmp_path / "out")
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    *before, last = lines
    assert last.startswith("colibri: error: ") and "contains NaN or Inf" in last, done.stderr
    assert all(progress_line(line) == line for line in before), done.stderr
