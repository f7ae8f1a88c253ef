"""One request grammar for every board: a Linux firmware reads on stdin the frame an MCU reads on its
UART, one parser (firmware_src/app/request.c) checks every field's range, refuses anything lenient
with a reason in an error frame, and a fuzz target keeps it honest."""

from __future__ import annotations

import subprocess
import zlib

import pytest
from conftest import DEFAULT_MODEL, REPO
from libfuzzer import build_fuzzer, run_fuzzer

from generator.device.protocol import FrameReader, encode_frame, f32_bits
from generator.device.runner import run_on_board
from generator.device.session import RunRequest, request_frame
from generator.errors import ColibriError

pytestmark = pytest.mark.slow  # hostile requests to built firmware

APP = REPO / "firmware_src" / "app"
RUNTIME = REPO / "firmware_src" / "runtime"


def frame(body: str) -> bytes:
    """A request line with a correct CRC around an arbitrary body ("@CLB 0 request ...")."""
    return f"{body} *{zlib.crc32(body.encode()):08x}\n".encode()


GOOD = "@CLB 0 request prompt=1,5,9 steps=3"
BAD = {
    "repeated key": (GOOD + " steps=4", "a request field is repeated"),
    "repeated prompt": ("@CLB 0 request prompt=1 prompt=2 steps=3", "a request field is repeated"),
    "trailing comma": ("@CLB 0 request prompt=1,5, steps=3", "prompt must be comma-separated token ids"),
    "empty item": ("@CLB 0 request prompt=1,,5 steps=3", "prompt must be comma-separated token ids"),
    "plus sign": ("@CLB 0 request prompt=+1 steps=3", "prompt must be comma-separated token ids"),
    "id above int32": ("@CLB 0 request prompt=2147483648 steps=3", "prompt must be comma-separated token ids"),
    "eos above one": (GOOD + " eos=5", "eos must be 0 or 1"),
    "digests above one": (GOOD + " digests=9", "digests must be 0 or 1"),
    "zero steps": (
        "@CLB 0 request prompt=1 steps=0",
        "steps must be between 1 (0 when scoring) and the context length",
    ),
    "steps beyond the context": (
        "@CLB 0 request prompt=1 steps=65",
        "steps must be between 1 (0 when scoring) and the context length",
    ),
    "start beyond the context": (GOOD + " start=64", "start must be a position within the context"),
    "score_from past the prompt": (GOOD + " score_from=3", "score_from must be an index into the prompt"),
    "score_from beyond the context": (GOOD + " score_from=64", "score_from must be a position within the context"),
    "repeated start": (GOOD + " start=0 start=0", "a request field is repeated"),
    "decode_from with score_from": (
        GOOD + " decode_from=1 score_from=1",
        "decode_from and score_from exclude each other",
    ),
    "decode_from zero": (GOOD + " decode_from=0", "decode_from must be an index into the prompt after its first token"),
    "decode_from past the prompt": (
        GOOD + " decode_from=3",
        "decode_from must be an index into the prompt after its first token",
    ),
    "decode_from beyond the context": (GOOD + " decode_from=64", "decode_from must be a position within the context"),
    "decode_from negative": (GOOD + " decode_from=-1", "decode_from must be a position within the context"),
    "trace past the steps": (GOOD + " trace=3", "trace must be a step of the request"),
    "trace negative": (GOOD + " trace=-1", "trace must be a step of the request"),
    "steps short of the decoded prompt": (
        "@CLB 0 request prompt=1,5,9,7 steps=2 decode_from=1",
        "steps must cover the prompt tokens from decode_from on",
    ),
    "repeated decode_from": (GOOD + " decode_from=1 decode_from=1", "a request field is repeated"),
    "negative seed": (GOOD + " seed=-1", "seed must be a non-negative integer"),
    "seed past 2^64": (GOOD + " seed=18446744073709551616", "seed must be a non-negative integer"),
    "infinite temperature": (
        GOOD + f" temperature={f32_bits(float('inf'))}",
        "temperature must be a finite number >= 0",
    ),
    "NaN temperature": (GOOD + " temperature=7fc00000", "temperature must be a finite number >= 0"),
    "negative temperature": (GOOD + f" temperature={f32_bits(-0.5)}", "temperature must be a finite number >= 0"),
    "top_p zero": (GOOD + f" top_p={f32_bits(0.0)}", "top_p must be in (0, 1]"),
    "min_p above one": (GOOD + f" min_p={f32_bits(1.5)}", "min_p must be in [0, 1]"),
    "zero threads": (GOOD + " threads=0", "threads must be between 1 and 64"),
    "65 threads": (GOOD + " threads=65", "threads must be between 1 and 64"),
    "huge probe": (GOOD + " probe_mib=2000000", "probe_mib must be a size in MiB"),
    "65 drafted tokens": (GOOD + " speculate=65", "speculate must be between 0 and 64 drafted tokens"),
    "negative speculation": (GOOD + " speculate=-1", "speculate must be between 0 and 64 drafted tokens"),
    "unknown key": (GOOD + " color=3", "unknown request field"),
    "repeat penalty zero": (GOOD + f" repeat_penalty={f32_bits(0.0)}", "repeat_penalty must be a finite number > 0"),
    "repeat penalty negative": (
        GOOD + f" repeat_penalty={f32_bits(-1.1)}",
        "repeat_penalty must be a finite number > 0",
    ),
    "repeat penalty infinite": (
        GOOD + f" repeat_penalty={f32_bits(float('inf'))}",
        "repeat_penalty must be a finite number > 0",
    ),
    "repeat window beyond the context": (
        GOOD + " repeat_last_n=65",
        "repeat_last_n must be between 0 and the context length",
    ),
    "repeat window negative": (GOOD + " repeat_last_n=-1", "repeat_last_n must be between 0 and the context length"),
    "no steps": ("@CLB 0 request prompt=1", "a request needs prompt and steps"),
    "key without value": (GOOD + " seed", "malformed request field"),
    "double space": ("@CLB 0 request  prompt=1 steps=3", "malformed request field"),
    "selftest with a field": ("@CLB 0 selftest steps=3", "not a request frame"),
    "selftest twice": ("@CLB 0 selftest selftest", "not a request frame"),
}


@pytest.fixture(scope="module")
def host_firmware(builder):
    board, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 64)
    return art


def run_host(art, stdin: bytes):
    done = subprocess.run(
        [str(art.program), "--weights", str(art.weights)], input=stdin, capture_output=True, timeout=60
    )
    reader = FrameReader()
    reader.feed(done.stdout)
    return done.returncode, reader.frames


def test_the_linux_firmware_decodes_the_request_frame_it_reads_on_stdin(host_firmware):
    code, frames = run_host(host_firmware, frame(GOOD))
    assert code == 0
    assert [f.kind for f in frames] == ["hello", "token", "token", "token", "stats", "done"]


def test_a_selftest_request_between_decodes_answers_its_frame_and_the_next_request_decodes(host_firmware):
    code, frames = run_host(host_firmware, frame("@CLB 0 selftest") + frame(GOOD.replace(" 0 ", " 1 ")))
    assert code == 0
    assert [f.kind for f in frames] == ["hello", "selftest", "done", "token", "token", "token", "stats", "done"]
    assert frames[1].fields["result"] == "pass" and frames[2].fields["reason"] == "selftest"


def test_decode_from_decodes_the_prompts_tail_as_steps_then_samples(host_firmware):
    """Teacher forcing: prompt 1,5,9,7 with decode_from=1 prefills one token, then steps 0..2 are the
    prompt's 5, 9, 7, each fed in its own forward pass, and step 3 is sampled."""
    code, frames = run_host(host_firmware, frame("@CLB 0 request prompt=1,5,9,7 steps=4 eos=0 decode_from=1"))
    assert code == 0
    tokens = [int(f.fields["id"]) for f in frames if f.kind == "token"]
    stats = next(f for f in frames if f.kind == "stats").fields
    done = next(f for f in frames if f.kind == "done").fields
    assert tokens[:3] == [5, 9, 7] and len(tokens) == 4
    assert stats["prompt"] == "1" and stats["decode"] == "3" and done["held"] == "4"
    # The sampled step is the one a plain request of the whole prompt samples first.
    code, plain = run_host(host_firmware, frame("@CLB 0 request prompt=1,5,9,7 steps=1"))
    assert tokens[3] == int(next(f for f in plain if f.kind == "token").fields["id"])


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_lenient_or_out_of_range_request_is_refused_with_its_reason(host_firmware, case):
    body, reason = BAD[case]
    code, frames = run_host(host_firmware, frame(body))
    assert code == 2
    errors = [f for f in frames if f.kind == "error"]
    assert len(errors) == 1 and errors[0].fields["code"] == "100", frames
    assert errors[0].fields["msg"].startswith(reason)
    assert not any(f.kind == "token" for f in frames)


@pytest.mark.parametrize(
    "stdin,reason",
    [
        (b"", "no request frame on stdin"),
        (GOOD.encode() + b" *00000000\n", "request frame damaged in transit (CRC mismatch)"),
        (b"prompt=1 steps=3\n", "not a request frame"),
    ],
)
def test_no_request_a_damaged_one_or_not_a_frame(host_firmware, stdin, reason):
    code, frames = run_host(host_firmware, stdin)
    assert code == 2 and frames[-1].kind == "error" and frames[-1].fields["msg"].startswith(reason)


def test_the_argv_keeps_only_what_is_not_a_request(host_firmware):
    done = subprocess.run(
        [str(host_firmware.program), "--weights", str(host_firmware.weights), "--steps", "3"],
        input=frame(GOOD),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2 and b"unknown option" in done.stderr


def run_on_qemu_rv32_sending(line: str, builder, monkeypatch) -> None:
    """A run on qemu-rv32 whose request frame carries this line instead of the request's own."""
    from generator.device import serial_link

    board, art, plan = builder.build(DEFAULT_MODEL, "q8_0", 64, "qemu-rv32")
    monkeypatch.setattr(serial_link, "request_frame", lambda request, seq=0: frame(line))
    request = RunRequest([1, 5, 9], 3)
    run_on_board(board, art.program, art.weights, request, art.model_hash(), flash_image=art.flash_image, timeout=60)


def test_an_mcu_answers_a_bad_request_with_an_error_frame_instead_of_silence(builder, monkeypatch):
    """qemu-rv32's serve loop used to drop a bad line and leave the host waiting for its timeout."""
    with pytest.raises(ColibriError, match="firmware reported error 100: eos must be 0 or 1"):
        run_on_qemu_rv32_sending(GOOD + " eos=5", builder, monkeypatch)


def test_an_mcu_refuses_threads_and_a_bandwidth_probe(builder, monkeypatch):
    with pytest.raises(ColibriError, match="this board runs one thread"):
        run_on_qemu_rv32_sending(GOOD + " threads=2", builder, monkeypatch)


def test_libfuzzer_finds_no_request_the_parser_mishandles(tmp_path):
    fuzzer = build_fuzzer(
        tmp_path / "fuzz_request",
        "-DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION",
        f"-I{APP}",
        REPO / "tests" / "c" / "fuzz_request.c",
        APP / "request.c",
        RUNTIME / "checksum.c",
    )
    seeds, corpus = tmp_path / "seeds", tmp_path / "corpus"
    seeds.mkdir()
    corpus.mkdir()
    (seeds / "good").write_bytes(frame(GOOD))
    (seeds / "full").write_bytes(request_frame(RunRequest([1, 2, 3], 8, threads=2, probe_bandwidth_mib=0)))
    (seeds / "scored").write_bytes(request_frame(RunRequest([1, 2, 3], 0, start=5, score_from=1)))
    (seeds / "forced").write_bytes(request_frame(RunRequest([1, 2, 3, 4], 5, decode_from=2)))
    for i, (body, _) in enumerate(sorted(BAD.values())):
        (seeds / f"bad{i}").write_bytes(frame(body))
    (seeds / "other-kind").write_bytes(encode_frame(0, "hello", {"proto": 1}))
    # Requests are short and the parser fast (hundreds of thousands of runs): a small ASan quarantine
    # keeps the fuzzer's memory bounded.
    run = run_fuzzer(
        fuzzer, corpus, seeds, tmp_path, "-max_total_time=15", "-max_len=1024",
        malloc_limit_mb=256, timeout=180, asan_options="quarantine_size_mb=16",
    )  # fmt: skip
    assert "Done" in run.stderr and not list(tmp_path.glob("crash-*"))
