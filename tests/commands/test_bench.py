"""bench: what it reports (not how fast: speeds are measured, not asserted), and --plot."""

import argparse
import json
import platform
import re
import statistics

import pytest
from conftest import DEFAULT_MODEL, run_cli

from generator import bench
from generator.bench import text as bench_text
from generator.boards import load_board
from generator.device.session import RunResult

pytestmark = pytest.mark.slow  # benchmarks built firmware


def probed_run(decode_us: int, read_bw: float) -> RunResult:
    """A run of 100 decode passes in decode_us microseconds, after a probe that read read_bw bytes/s."""
    return RunResult(
        stats={
            "prompt": "8",
            "prefill_us": "1000",
            "decode": "100",
            "decode_us": str(decode_us),
            "forward_us": str(decode_us),
        },
        bandwidth={"read_bw": str(int(read_bw)), "mib": "600", "threads": "1", "passes": "5"},
    )


def test_each_runs_share_is_taken_against_its_own_probe_and_the_median_share_is_reported():
    weight = 100_000_000
    # 100, 200 and 125 tok/s, probed at 10, 20 and 16 GB/s: shares 1.0, 1.0 and 0.78.
    runs = [
        bench.run_figures(r, weight)
        for r in (probed_run(1_000_000, 10e9), probed_run(500_000, 20e9), probed_run(800_000, 16e9))
    ]
    assert [r.read_bandwidth_bytes_s for r in runs] == [10e9, 20e9, 16e9]
    assert [r.bandwidth_fraction for r in runs] == pytest.approx([1.0, 1.0, 0.78125])
    summary = bench.bandwidth_summary(weight, runs)
    assert summary.read_bandwidth_bytes_s == bench.ProbeRange(min=10e9, median=16e9, max=20e9)
    # Not the median speed over the median probe (125 tok/s x 100 MB / 16 GB/s = 0.78).
    assert summary.bandwidth_fraction == pytest.approx(1.0)
    assert summary.bandwidth_limit_tok_s == pytest.approx(160.0)
    # --json writes them under the same names.
    assert summary.to_json()["read_bandwidth_bytes_s"] == {"min": 10e9, "median": 16e9, "max": 20e9}


def test_without_probes_there_is_no_bandwidth_figure():
    run = bench.run_figures(
        RunResult(stats={"prompt": "8", "prefill_us": "10", "decode": "4", "decode_us": "40"}), 1000
    )
    assert run.read_bandwidth_bytes_s is None and run.bandwidth_fraction is None
    assert bench.bandwidth_summary(1000, [run]).to_json() == {
        "read_bandwidth_bytes_s": None,
        "bandwidth_fraction": None,
        "bandwidth_limit_tok_s": None,
    }


def test_only_natively_run_linux_boards_probe_their_bandwidth():
    assert bench.probes_bandwidth(load_board("host"))
    assert not bench.probes_bandwidth(load_board("qemu-rv32"))
    # Under qemu-aarch64 the figure would be the emulator's, not an aarch64 board's.
    assert bench.probes_bandwidth(load_board("linux-aarch64")) == (platform.machine() == "aarch64")


def test_bench_reports_rates_latencies_memory_and_bandwidth_and_plots_rate_against_context(tmp_path):
    png = tmp_path / "rate.png"
    done = run_cli(
        "bench",
        "--board",
        "host",
        "--model",
        DEFAULT_MODEL,
        "--ctx",
        128,
        "--steps",
        40,
        "--prompt-tokens",
        12,
        "--repeat",
        2,
        "--json",
        "--plot",
        png,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["prompt_tokens"] == 12 and out["decode_steps"] == 40 and len(out["runs"]) == 2
    # A dense model reads every weight whatever the token: today's synthetic stream, no in-RAM runs.
    assert out["stream"]["kind"] == "synthetic" and "experts_used_per_layer" not in out["stream"]
    assert out["in_ram"] is None
    assert out["prefill_tok_s"] > 0 and out["decode_tok_s"] > 0
    assert 0 < out["ms_per_token"]["p50"] <= out["ms_per_token"]["p99"] <= out["ms_per_token"]["max"]
    assert out["peak_rss_bytes"] > out["weight_bytes_per_token"] > 0
    # The firmware probed the read bandwidth before each run, with the decode's threads.
    probes = [r["read_bandwidth_bytes_s"] for r in out["runs"]]
    assert all(p > 1e8 for p in probes)
    assert out["read_bandwidth_bytes_s"] == {
        "min": min(probes),
        "median": statistics.median(probes),
        "max": max(probes),
    }
    assert out["read_bandwidth_probe"]["threads"] == 1 and out["read_bandwidth_probe"]["mib"] >= 256
    assert out["read_bandwidth_probe"]["huge_pages"] is True  # as the weights, read into memory
    for r in out["runs"]:
        assert (
            r["bandwidth_fraction"] == out["weight_bytes_per_token"] * r["decode_tok_s"] / r["read_bandwidth_bytes_s"]
        )
    assert out["bandwidth_fraction"] == statistics.median(r["bandwidth_fraction"] for r in out["runs"])
    assert out["bandwidth_limit_tok_s"] == out["read_bandwidth_bytes_s"]["median"] / out["weight_bytes_per_token"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rate.png"]  # no temporary file left behind


def test_bench_on_the_emulated_mcu_counts_instructions_and_refuses_to_plot_wall_clock(tmp_path):
    done = run_cli(
        "bench",
        "--board",
        "qemu-rv32",
        "--model",
        DEFAULT_MODEL,
        "--ctx",
        64,
        "--steps",
        8,
        "--repeat",
        1,
        "--plot",
        tmp_path / "rate.png",
    )
    assert done.returncode == 2
    assert "emulated" in done.stderr and "instruction counts" in done.stderr
    assert not any(tmp_path.iterdir())
    done = run_cli(
        "bench", "--board", "qemu-rv32", "--model", DEFAULT_MODEL, "--ctx", 64, "--steps", 8, "--repeat", 1, "--json"
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["decode_instructions_per_token"] > out["macs_per_token"] > 0
    assert out["predicted_esp32p4"]["tok_s"] > 0


def test_bench_text_gives_the_median_share_and_the_range_of_the_probes_next_to_each_run():
    done = run_cli(
        "bench", "--board", "host", "--model", DEFAULT_MODEL, "--ctx", 64, "--steps", 8, "--repeat", 3, "--threads", 2
    )
    assert done.returncode == 0, done.stderr
    m = re.search(
        r"= (\d+)% of the read bandwidth the firmware measured just before each run \(median of the runs' "
        r"shares; probes (\d+\.\d)–(\d+\.\d) GB/s, median (\d+\.\d), 2 thread\(s\) over (\d+) MiB"
        r"( in 2 MiB pages)?;",
        done.stdout,
    )
    assert m, done.stdout
    assert float(m[2]) <= float(m[4]) <= float(m[3]) and int(m[5]) >= 256
    # The model fits in memory, so the firmware read it in, and probed the way it then reads.
    assert m[6] == " in 2 MiB pages"
    assert len(re.findall(r"run \d/3: .* tok/s, read bandwidth \d+\.\d GB/s just before", done.stderr)) == 3


def test_an_emulated_linux_board_gets_no_bandwidth_figure_in_the_text():
    stream = bench.StreamFigures(
        "synthetic", None, None, None, 8, 15, 15, None, "synthetic 8-token prompt, greedy decoding", None
    )
    clocked = bench.ClockedFigures(10.0, 5.0, 5.0, None, 2**20, bench.bandwidth_summary(200_000, []), None)
    out = bench.BenchResult(
        board="linux-aarch64",
        model="kjv-tiny",
        architecture="LlamaForCausalLM",
        quant="q8_0",
        n_ctx=256,
        threads=1,
        kernels="neon",
        prompt_tokens=8,
        decode_steps=16,
        repeat=1,
        emulated_by="qemu-aarch64",
        speed_note=None,
        weight_bytes_per_token=200_000,
        macs_per_token=100_000,
        runs=[],
        memory_budget=None,
        stream=stream,
        cache=None,
        in_ram=None,
        remote=None,
        counted=None,
        clocked=clocked,
    )
    line = bench.bench_line(out, "kjv-tiny")
    assert "on linux-aarch64 EMULATED by qemu-aarch64" in line
    assert "the emulator's speed on this machine, not the board's" in line
    assert "no bandwidth figure: the emulator's reads are not the board's" in line and "GB/s" not in line


def test_sweep_values_are_counts_comma_separated_and_each_is_checked():
    from generator.arguments import counts

    threads = counts(1, 64, what="a thread count from 1 to 64")
    assert threads("2") == 2 and threads("1,2,4") == (1, 2, 4)
    for bad in ("0", "1,,2", "1,x", "65", "1,1"):
        with pytest.raises(argparse.ArgumentTypeError):
            threads(bad)
    pts = bench_text.points((1, 2), (64, 512), None)
    assert [(p.threads, p.prompt_tokens, p.steps) for p in pts] == [
        (1, 64, None),
        (1, 512, None),
        (2, 64, None),
        (2, 512, None),
    ]
    assert not bench_text.is_sweep(2, 8, 16) and bench_text.is_sweep(1, 8, (16, 64))


def test_a_busy_machine_is_said_to_distort_the_numbers():
    assert bench_text.load_warning(before=0.3, after=1.2, cores=2, threads=1) is None  # the bench's own thread
    busy = bench_text.load_warning(before=7.9, after=8.3, cores=2, threads=1)
    assert busy and busy.startswith("the machine is busy: load average 7.9 before the bench and 8.3 after it on 2 core")
    assert bench_text.load_warning(before=0.1, after=6.0, cores=4, threads=2)  # work that started during it


def test_a_sweep_gives_a_row_per_combination_as_markdown_csv_or_json(tmp_path):
    """Two runs of 2 steps on the bundled model (the build of the test above, at context 128)."""
    args = ["bench", "--model", DEFAULT_MODEL, "--ctx", 128, "--steps", 2, "--prompt-tokens", 4, "--repeat", 1]
    done = run_cli(*args, "--threads", "1,2", "--output", "json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [tuple(r) for r in rows] == [bench_text.COLUMNS] * 2
    assert [(r["n_threads"], r["n_prompt"], r["n_gen"], r["repetitions"]) for r in rows] == [(1, 4, 2, 1), (2, 4, 2, 1)]
    assert all(r["tg_avg_ts"] > 0 and r["pp_avg_ts"] > 0 and r["tg_stddev_ts"] == 0.0 for r in rows)

    csv_lines = bench_text.format_rows(rows, "csv").splitlines()
    assert csv_lines[0] == ",".join(bench_text.COLUMNS) and len(csv_lines) == 3
    assert csv_lines[2].split(",")[3:7] == ["2", "4", "2", "1"]
    md_lines = bench_text.format_rows(rows, "md").splitlines()
    assert md_lines[0] == "| " + " | ".join(bench_text.COLUMNS) + " |" and len(md_lines) == 4
    assert md_lines[1].count("|") == len(bench_text.COLUMNS) + 1

    refused = run_cli(*args, "--threads", "1,2", "--plot", tmp_path / "p.png")
    assert refused.returncode == 2 and refused.stderr.startswith("colibri: error: --plot draws one run")
