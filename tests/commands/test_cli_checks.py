"""Options a command cannot honour are refused (or warned about) instead of dropped, and every
request check comes before compiling: a refused command prints one line, compiles nothing and
leaves no build directory behind."""

from __future__ import annotations

import io
import json
import time

import pytest
from conftest import DEFAULT_MODEL, run_cli
from test_cli_errors import one_line_error

from generator import cli, job
from generator.boards import load_board
from generator.console import TextStream
from generator.device import ports
from generator.errors import ColibriError
from generator.option_checks import threads_warning

pytestmark = pytest.mark.slow  # option checks through the CLI on built firmware


def refused_before_compiling(tmp_path, *args):
    out = tmp_path / "build"
    start = time.monotonic()
    done = run_cli(*args, "--out", out)
    assert "  CC " not in done.stderr and "GEN" not in done.stderr, done.stderr
    assert not out.exists()
    assert time.monotonic() - start < 30
    return done


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["run", "--board", "linux-aarch64", "--port", "/dev/does-not-exist", "--prompt", "And God"],
            [
                "--port is for boards on a serial port (esp32p4, esp32p4-idf)",
                "board linux-aarch64 runs under qemu-aarch64 (user-mode emulation",
            ],
        ),
        (
            ["verify", "--board", "host", "--reset", "--prompt", "And God"],
            ["--reset is for boards on a serial port", "board host runs natively"],
        ),
        (
            ["bench", "--board", "qemu-rv32", "--port", "/dev/ttyUSB0"],
            ["--port is for boards on a serial port", "board qemu-rv32 runs under qemu-system-riscv32"],
        ),
        (
            ["run", "--board", "qemu-rv32", "--threads", "2", "--prompt", "And God"],
            ["--threads is for multi-threaded (Linux) boards (host, host-mpi, linux-aarch64, linux-aarch64-mpi)"],
        ),
        (
            ["run", "--greedy", "--temperature", "0.7", "--prompt", "And God"],
            ["--greedy contradicts --temperature 0.7", "give one or the other"],
        ),
        (
            ["verify", "--greedy", "--seed", "3", "--top-k", "5", "--prompt", "And God"],
            ["--greedy contradicts --top-k 5, --seed 3"],
        ),
        (
            ["run", "--temperature", "0", "--top-p", "0.9", "--prompt", "And God"],
            ["--temperature 0 is greedy decoding, so --top-p 0.9 would have no effect"],
        ),
        (
            ["run", "--prompt", "And God", "--prompt-ids", "1,2"],
            ["give one of --prompt, --prompt-file and --prompt-ids, not --prompt and --prompt-ids"],
        ),
    ],
)
def test_options_that_would_be_ignored_are_refused_before_compiling(tmp_path, args, words):
    one_line_error(refused_before_compiling(tmp_path, *args), *words)


def test_prompt_and_steps_beyond_the_context_are_refused_before_compiling_and_say_why(tmp_path):
    done = refused_before_compiling(tmp_path, "run", "--prompt", "And God", "--ctx", "16", "--steps", "20")
    one_line_error(
        done,
        "the prompt's 3 tokens and 20 steps need a context of 22: 3 positions for the prompt "
        "and 19 for the generated tokens fed back into the model (the last one never is)",
        "built for a context of 16",
        "use --ctx 22 or --steps 14 or fewer",
    )
    # Beyond what the model allows, the advice is a --ctx that works, not one that is refused too.
    done = refused_before_compiling(tmp_path, "run", "--prompt-ids", "1,2,3", "--steps", "300")
    one_line_error(done, "need a context of 302", "allow a context of at most 256", "use --steps 254 or fewer")
    # A prompt longer than the whole context: the longest prompt that still leaves room for the
    # steps (256 - 64 + 1 at the default 64 steps), not one that is refused in turn.
    done = refused_before_compiling(tmp_path, "run", "--prompt-ids", ",".join(["1"] * 482))
    one_line_error(
        done,
        "need a context of 545",
        "use a prompt of at most 193 tokens with --steps 64, or of at most 256 tokens with --steps 1",
    )
    done = refused_before_compiling(tmp_path, "bench", "--board", "esp32p4", "--steps", "128", "--port", "/dev/null")
    one_line_error(
        done, "the prompt's 8 tokens and 128 steps need a context of 135", "use --ctx 135 or --steps 121 or fewer"
    )


def test_a_board_on_a_serial_port_without_one_prints_nothing_on_stdout(monkeypatch, capsys):
    monkeypatch.setattr(ports, "list_ports", lambda: [])
    code = cli.main(["run", "--board", "esp32p4", "--prompt", "And God"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""  # no half line (the prompt) before the error
    assert (
        captured.err.strip()
        .splitlines()[-1]
        .startswith("colibri: error: board esp32p4 needs a serial port and none looks like an ESP32 board")
    )


def test_the_text_stream_prints_nothing_before_the_first_token_and_closes_its_line(capsys):
    from generator.model.tokenizer import Tokenizer

    stream = TextStream(Tokenizer.for_model(DEFAULT_MODEL), enabled=True, echo="And God")
    assert capsys.readouterr().out == ""
    stream(0, 42)
    stream.end_line()
    out = capsys.readouterr().out
    assert out.startswith("And God") and out.endswith("\n") and out.count("\n") == 1
    stream.end_line()  # nothing more to close
    assert capsys.readouterr().out == ""


def test_more_threads_than_cores_is_a_warning():
    host, aarch64, p4 = (load_board(n) for n in ("host", "linux-aarch64", "esp32p4"))
    assert threads_warning(host, 2, cores=2) is None
    message = threads_warning(host, 4, cores=2)
    assert "--threads 4 on a machine with 2 core(s)" in message and "slower than with --threads 2" in message
    if aarch64.runner.emulated_by():  # on an x86 machine: the emulator's threads share the cores too
        assert "(under qemu-aarch64)" in threads_warning(aarch64, 8, cores=2)
    assert threads_warning(p4, 4, cores=2) is None  # refused elsewhere: MCUs run one thread


def test_the_cli_warns_about_oversubscribed_threads(tmp_path):
    done = run_cli("run", "--prompt-ids", "1,2", "--steps", "2", "--threads", "64", "--out", tmp_path / "b")
    assert done.returncode == 0, done.stderr
    assert "colibri: warning: --threads 64 on a machine with" in done.stderr


def test_prompt_from_a_file_and_from_standard_input(tmp_path, monkeypatch, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("And God said\n")
    done = run_cli("run", "--prompt-file", prompt, "--greedy", "--steps", "4", "--out", tmp_path / "b", "--json")
    assert done.returncode == 0, done.stderr
    by_file = json.loads(done.stdout)
    done = run_cli("run", "--prompt", "And God said", "--greedy", "--steps", "4", "--out", tmp_path / "b", "--json")
    assert json.loads(done.stdout)["prompt"] == by_file["prompt"]  # the final newline dropped
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"And God said")))  # a real stdin: bytes underneath
    args = cli.parse_args(["run", "--prompt-file", "-"])
    assert job.prompt_text(args) == "And God said"
    one_line_error(run_cli("run", "--prompt-file", tmp_path / "absent.txt"), "--prompt-file", "No such file")


def test_report_on_a_model_that_does_not_fit_shows_the_table_then_the_documented_line(tmp_path):
    done = refused_before_compiling(tmp_path, "report", "--board", "esp32p4", "--quant", "f32")
    assert done.returncode == 2
    assert done.stdout.startswith(
        "memory report: kjv-tiny (LlamaForCausalLM), f32, context 128, KV cache f16, board esp32p4 "
        "(planned, not linked: code is the board's reserve)"
    )
    assert "OVER BUDGET" in done.stdout and "weights" in done.stdout
    one_line_error(
        done,
        "kjv-tiny (f32, context 128) does not fit board esp32p4: region l2mem needs 794,952 B "
        "(code 45,056, weights 694,216, kv_cache 32,768, scratch 14,720, rope_tables 8,192; "
        "code is the board's reserve) but has 393,216 B",
    )


def test_an_empty_text_to_score_is_said_to_be_empty_before_compiling(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    done = refused_before_compiling(tmp_path, "eval", "--text", empty)
    one_line_error(done, f"--text {empty}: the text is empty: give a file with the text to score")


def test_a_text_shorter_than_a_chunk_counts_its_tokens_in_words(tmp_path):
    from generator.evaluate import evaluate

    plan = job.plan_build(job.JobOptions(out=tmp_path / "build")).plan
    with pytest.raises(ColibriError, match=r"the text is 1 token, less than one chunk of 256 \(the firmware"):
        evaluate([1], plan, 1, lambda request: None)
