"""bench: what it reports (not how fast: speeds are measured, not asserted), and --plot."""

import json

from conftest import DEFAULT_MODEL, run_cli


def test_bench_reports_rates_latencies_memory_and_bandwidth_and_plots_rate_against_context(tmp_path):
    png = tmp_path / "rate.png"
    done = run_cli("bench", "--board", "host", "--model", DEFAULT_MODEL, "--ctx", 128, "--steps", 40,
                   "--prompt-tokens", 12, "--repeat", 2, "--json", "--plot", png)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["prompt_tokens"] == 12 and out["decode_steps"] == 40 and len(out["runs"]) == 2
    assert out["prefill_tok_s"] > 0 and out["decode_tok_s"] > 0
    assert 0 < out["ms_per_token"]["p50"] <= out["ms_per_token"]["p99"] <= out["ms_per_token"]["max"]
    assert out["peak_rss_bytes"] > out["weight_bytes_per_token"] > 0
    assert out["read_bandwidth_bytes_s"] > 0
    assert out["bandwidth_fraction"] == out["weight_bytes_per_token"] * out["decode_tok_s"] / out["read_bandwidth_bytes_s"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rate.png"]  # no temporary file left behind


def test_bench_on_the_emulated_mcu_counts_instructions_and_refuses_to_plot_wall_clock(tmp_path):
    done = run_cli("bench", "--board", "qemu-rv32", "--model", DEFAULT_MODEL, "--ctx", 64, "--steps", 8,
                   "--repeat", 1, "--plot", tmp_path / "rate.png")
    assert done.returncode == 2
    assert "emulated" in done.stderr and "instruction counts" in done.stderr
    assert not any(tmp_path.iterdir())
    done = run_cli("bench", "--board", "qemu-rv32", "--model", DEFAULT_MODEL, "--ctx", 64, "--steps", 8,
                   "--repeat", 1, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["decode_instructions_per_token"] > out["macs_per_token"] > 0
    assert out["predicted_esp32p4"]["tok_s"] > 0
