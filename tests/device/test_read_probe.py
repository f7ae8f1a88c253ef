"""The firmware's own read-bandwidth probe (firmware_src/bsp/linux/read_probe.c): asked for with
probe_mib in the request frame, reported in a bandwidth frame before the decode, run in a child process."""

from pathlib import Path

import pytest
from conftest import DEFAULT_MODEL

from generator.boards import load_board
from generator.device.protocol import encode_frame, parse_frame
from generator.device.runner import run_on_board
from generator.device.session import RunRequest, Session, request_frame
from generator.errors import ColibriError


def test_the_bandwidth_frame_is_parsed_into_the_run_result():
    session = Session()
    for raw in [
        encode_frame(0, "hello", {"proto": 1}),
        encode_frame(1, "bandwidth", {"read_bw": 12345678901, "mib": 600, "threads": 2, "passes": 5}),
        encode_frame(2, "token", {"step": 0, "id": 7}),
        encode_frame(3, "stats", {"prompt": 1, "decode": 0}),
        encode_frame(4, "done", {"tokens": 1, "reason": "length"}),
    ]:
        session.handle(parse_frame(raw.rstrip(b"\n")))
    assert session.finished
    assert session.result.bandwidth == {"read_bw": "12345678901", "mib": "600", "threads": "2", "passes": "5"}
    assert session.result.tokens == [7]


def test_the_probe_is_asked_for_only_when_the_request_says_so():
    assert parse_frame(request_frame(RunRequest([1], 4)).rstrip(b"\n")).fields.get("probe_mib") is None
    assert (
        parse_frame(request_frame(RunRequest([1], 4, probe_bandwidth_mib=0)).rstrip(b"\n")).fields["probe_mib"] == "0"
    )


def test_an_mcu_board_cannot_probe_its_bandwidth(tmp_path):
    with pytest.raises(ColibriError, match="cannot measure its read bandwidth"):
        run_on_board(
            load_board("qemu-rv32"),
            tmp_path / "fw",
            tmp_path / "img",
            RunRequest([1], 4, probe_bandwidth_mib=0),
            "0" * 64,
        )


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_the_firmware_measures_a_plausible_bandwidth_with_the_decodes_threads_without_touching_its_peak_rss(
    builder, threads
):
    board, art, plan = builder.build(DEFAULT_MODEL, ctx=64)
    plain = RunRequest([1, 5, 9], 8, stop_at_eos=False, threads=threads, digests=True)
    probed = RunRequest([1, 5, 9], 8, stop_at_eos=False, threads=threads, digests=True, probe_bandwidth_mib=64)
    without = run_on_board(board, art.program, art.weights, plain, art.model_hash())
    result = run_on_board(board, art.program, art.weights, probed, art.model_hash())
    bw = result.bandwidth
    assert without.bandwidth == {}
    assert int(bw["threads"]) == threads and int(bw["mib"]) == 64 and int(bw["passes"]) >= 1
    # Any machine this runs on reads DRAM at more than 100 MB/s and less than 10 TB/s.
    assert 1e8 < int(bw["read_bw"]) < 1e13
    # The same decode, and the 64 MiB buffer lived in a child process: not in the firmware's peak RSS.
    assert result.tokens == without.tokens and result.digests == without.digests
    assert 0 < int(result.stats["peak_rss"]) < 32 * 2**20


def largest_cache_mib() -> float:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    sizes = [f.read_text().strip() for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size")]
    return max((int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s) for s in sizes), default=0) / 2**20


@pytest.mark.slow  # fills a 256 MiB buffer
def test_without_a_size_the_buffer_is_twice_the_largest_cache_and_at_least_256_mib(builder):
    board, art, plan = builder.build(DEFAULT_MODEL, ctx=64)
    result = run_on_board(board, art.program, art.weights, RunRequest([1], 2, probe_bandwidth_mib=0), art.model_hash())
    mib = int(result.bandwidth["mib"])
    physical_mib = Path("/proc/meminfo").read_text().split()[1]  # MemTotal, kB
    assert mib >= min(max(256, 2 * largest_cache_mib()), int(physical_mib) / 1024 / 4 - 1)
    assert int(result.bandwidth["read_bw"]) > 1e8
