"""Numbers say what they are: a speed measured under an emulator is labelled the emulator's (text
and JSON) with no bandwidth share; an instruction count says what it counts; bench's defaults fit
the board (esp32p4's context of 128) and a deterministic count runs once."""

from __future__ import annotations

import json

import pytest
from conftest import DEFAULT_MODEL, run_cli

from generator import bench
from generator.boards import load_board
from generator.compile.build import prepare

pytestmark = pytest.mark.slow  # runs firmware under qemu-system and qemu-user


def test_bench_under_qemu_aarch64_is_labelled_emulated_in_text_and_json(tmp_path):
    out = tmp_path / "a64"
    done = run_cli("bench", "--board", "linux-aarch64", "--steps", "8", "--repeat", "1", "--out", out)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert "on linux-aarch64 EMULATED by qemu-aarch64" in line
    assert "the emulator's speed on this machine, not the board's" in line
    assert "GB/s" not in line and "% of the read bandwidth" not in line
    assert "under qemu-aarch64 emulation" in done.stderr  # the per-run progress lines too

    done = run_cli("bench", "--board", "linux-aarch64", "--steps", "8", "--repeat", "1", "--out", out, "--json")
    result = json.loads(done.stdout)
    assert result["emulated_by"] == "qemu-aarch64" and "not the board's" in result["speed_note"]
    assert result["read_bandwidth_bytes_s"] is None and result["bandwidth_fraction"] is None
    assert all(run["emulated_by"] == "qemu-aarch64" for run in result["runs"])


def test_run_under_qemu_aarch64_labels_its_speed(tmp_path):
    out = tmp_path / "a64"
    done = run_cli("run", "--board", "linux-aarch64", "--prompt", "And God", "--steps", "8", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "under qemu-aarch64 emulation (the emulator's speed on this machine, not the board's)" in done.stderr
    done = run_cli("run", "--board", "linux-aarch64", "--prompt", "And God", "--steps", "8", "--out", out, "--json")
    assert json.loads(done.stdout)["stats"]["emulated_by"] == "qemu-aarch64"


def test_host_speeds_are_not_labelled_emulated(tmp_path):
    done = run_cli("run", "--prompt", "And God", "--steps", "4", "--out", tmp_path / "h", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stats"]["emulated_by"] is None


def test_instruction_counts_say_what_they_count_and_run_once(tmp_path):
    out = tmp_path / "rv"
    done = run_cli("verify", "--board", "qemu-rv32", "--prompt", "And God", "--steps", "8", "--out", out)
    assert done.returncode == 0, done.stderr
    # verify: the model's sampling and the logits' hashes, at the contexts this request ran at
    assert "M instructions per decoded token (forward pass at contexts 4-10, sampling at temperature" in done.stderr, (
        done.stderr
    )
    assert "the logits' SHA-256, the token frame)" in done.stderr

    done = run_cli("bench", "--board", "qemu-rv32", "--steps", "8", "--out", out, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["repeat"] == 1 and len(result["runs"]) == 1  # exact counts: one run by default
    assert result["instructions_counted"] == (
        "forward pass at contexts 9-15, greedy sampling, no logits hashing, the token frame"
    )
    assert result["emulated_by"] == "qemu-system-riscv32"
    done = run_cli("bench", "--board", "qemu-rv32", "--steps", "8", "--out", out)
    assert "one run: the count is exact" in done.stdout and "no logits hashing" in done.stdout


def test_bench_defaults_fit_the_board():
    board = load_board("esp32p4")
    _, plan = prepare(board, DEFAULT_MODEL, "q8_0", None)
    assert plan.n_ctx == 128
    steps = bench.default_steps(plan, bench.DEFAULT_PROMPT_TOKENS)
    assert steps == 121 and bench.DEFAULT_PROMPT_TOKENS + steps - 1 == plan.n_ctx
    _, big = prepare(load_board("host"), DEFAULT_MODEL, "q8_0", None)
    assert bench.default_steps(big, bench.DEFAULT_PROMPT_TOKENS) == bench.DEFAULT_STEPS
    assert bench.default_repeat(load_board("qemu-rv32")) == 1 and bench.default_repeat(load_board("host")) == 3


def test_bench_on_esp32p4_with_its_defaults_gets_as_far_as_the_port(tmp_path):
    done = run_cli("bench", "--board", "esp32p4", "--port", "/dev/ttyCOLIBRI-none", "--out", tmp_path / "p4")
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("colibri: error:")]
    assert errors == [
        "colibri: error: cannot open serial port /dev/ttyCOLIBRI-none: No such file or directory "
        "(is the board plugged in? ./colibri devices lists the serial ports)"
    ], done.stderr


def test_plot_must_be_a_png(tmp_path):
    done = run_cli("bench", "--plot", tmp_path / "rate.txt", "--out", tmp_path / "b")
    assert done.returncode == 2 and "--plot writes a PNG image: name it with .png (got rate.txt)" in done.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "rate.txt").exists()
