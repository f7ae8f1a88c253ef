"""llama.cpp's repetition penalty on every command that samples (run, verify, chat), its two values
in the request only when it is on, and chat's replies of a stated length by default."""

from __future__ import annotations

import pytest
from cli_runs import main_json
from conftest import DEFAULT_MODEL

from generator import cli
from generator.chat import DEFAULT_REPLY_STEPS, ChatState
from generator.device.protocol import f32_bits
from generator.device.session import RunRequest, request_frame
from generator.job import JobOptions, sampling_from
from generator.model.chat_template import ChatTemplate
from generator.model.tokenizer import Tokenizer
from generator.numerics.sampling import SamplingParams

TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@pytest.mark.parametrize("command", ["run", "verify", "chat"])
def test_every_command_that_samples_takes_the_penalty_with_llama_cpps_defaults(command):
    args = cli.parse_args([command])
    assert (args.repeat_penalty, args.repeat_last_n) == (1.0, 64)
    args = cli.parse_args([command, "--repeat-penalty", "1.1", "--repeat-last-n", "-1"])
    assert (args.repeat_penalty, args.repeat_last_n) == (1.1, -1)


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--repeat-penalty", "0", "a penalty from 0.000001 to 1000000 (1 = off)"),
        ("--repeat-penalty", "-1.1", "a penalty from 0.000001 to 1000000 (1 = off)"),
        ("--repeat-penalty", "nan", "a penalty from 0.000001 to 1000000 (1 = off)"),
        ("--repeat-last-n", "-2", "a token count, 0 (off) or -1 (the whole context)"),
        ("--repeat-last-n", "1.5", "a token count, 0 (off) or -1 (the whole context)"),
    ],
)
def test_a_penalty_or_window_out_of_range_is_a_usage_error(capsys, option, value, says):
    with pytest.raises(SystemExit) as exited:
        cli.parse_args(["run", option, value])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"argument {option}: expected {says}, got {value!r}" in err
    assert len(err.strip().splitlines()) == 1


def test_bench_takes_no_penalty(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["bench", "--repeat-penalty", "1.1"])
    assert "unrecognized arguments: --repeat-penalty 1.1" in capsys.readouterr().err


def test_the_window_is_the_firmwares_context_at_most():
    def window(last_n: int) -> int:
        return sampling_from(JobOptions(repeat_penalty=1.1, repeat_last_n=last_n), DEFAULT_MODEL, 128).repeat_last_n

    assert [window(n) for n in (-1, 0, 64, 128, 5000)] == [128, 0, 64, 128, 128]


def test_the_request_carries_the_penalty_only_when_it_is_on():
    off = request_frame(RunRequest([1, 2], 3, SamplingParams(repeat_last_n=16)))
    assert b"repeat_" not in off
    on = request_frame(RunRequest([1, 2], 3, SamplingParams(repeat_penalty=1.1, repeat_last_n=16)))
    assert f" repeat_penalty={f32_bits(1.1)} repeat_last_n=16 ".encode() in on


def test_a_chat_reply_stops_at_the_stated_length_or_the_context():
    assert cli.parse_args(["chat"]).steps == DEFAULT_REPLY_STEPS == 256
    template, tokenizer = ChatTemplate(TEMPLATE), Tokenizer.for_model(DEFAULT_MODEL)
    assert ChatState(template, tokenizer, 4096, DEFAULT_REPLY_STEPS).plan_turn("And God said").steps == 256
    small = ChatState(template, tokenizer, 64, DEFAULT_REPLY_STEPS).plan_turn("And God said")
    assert small.steps == 64 - len(small.prompt) + 1  # what is left of the context


@pytest.mark.slow  # the bundled model's default host build, shared with the README's first command
def test_verify_checks_every_bit_of_a_penalized_decode(capsys):
    summary = main_json(capsys, "verify", prompt="And God said", steps=24, repeat_penalty=1.3, repeat_last_n=32)
    assert summary["pass"] and summary["sampling"]["repeat_penalty"] == pytest.approx(1.3)
    assert summary["firmware"]["tokens"] == summary["reference"]["tokens"]
