"""Every user mistake ends in one clear line and a non-zero exit, with nothing half-written."""

import json
import struct

import numpy as np
import pytest
from cli_runs import model_copy
from conftest import run_cli

pytestmark = pytest.mark.slow  # each user error through the CLI


def one_line_error(done, *fragments):
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("colibri: error: ")]
    assert len(errors) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def good_model(checkpoints, tmp_path):
    return model_copy(checkpoints, "qwen2_bias", tmp_path / "model")


def test_missing_model_directory(tmp_path):
    one_line_error(run_cli("build", "--model", tmp_path / "nope"), "does not exist")


def test_directory_without_config(tmp_path):
    one_line_error(run_cli("build", "--model", tmp_path), "no config.json")


def test_malformed_config(good_model):
    (good_model / "config.json").write_text("{ not json")
    one_line_error(run_cli("build", "--model", good_model), "config.json", "not valid JSON")


def test_unsupported_architecture_lists_the_supported_ones(good_model):
    cfg = json.loads((good_model / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (good_model / "config.json").write_text(json.dumps(cfg))
    one_line_error(run_cli("build", "--model", good_model), "GPT2LMHeadModel", "LlamaForCausalLM", "Qwen3ForCausalLM")


def test_inconsistent_config(good_model):
    cfg = json.loads((good_model / "config.json").read_text())
    cfg["num_key_value_heads"] = 3
    (good_model / "config.json").write_text(json.dumps(cfg))
    one_line_error(run_cli("build", "--model", good_model), "not divisible by num_key_value_heads")


def test_truncated_safetensors(good_model):
    path = good_model / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    one_line_error(run_cli("build", "--model", good_model), "model.safetensors")


def test_nan_in_weights_fails_generation_and_writes_nothing(good_model, tmp_path):
    path = good_model / "model.safetensors"
    blob = bytearray(path.read_bytes())
    (header_len,) = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8 : 8 + header_len])
    begin = 8 + header_len + header["model.norm.weight"]["data_offsets"][0]
    blob[begin : begin + 4] = np.float32(np.nan).tobytes()
    path.write_bytes(bytes(blob))
    out = tmp_path / "out"
    one_line_error(run_cli("build", "--model", good_model, "--out", out), "NaN")
    generated = out / "generated"
    assert not generated.exists() or not any(generated.iterdir())
    assert not (out / "firmware").exists()


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["verify", "--steps", "0"], "--steps"),
        (["verify", "--top-p", "2"], "--top-p"),
        (["build", "--board", "nonexistent"], "unknown board 'nonexistent'"),
        (["build", "--quant", "q3"], "--quant"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments(args, fragment, good_model):
    one_line_error(run_cli(*args, "--model", good_model) if args[0] != "frobnicate" else run_cli(*args), fragment)


def test_context_too_small_for_the_request(good_model):
    one_line_error(
        run_cli("run", "--model", good_model, "--ctx", "8", "--prompt-ids", "1,2,3", "--steps", "20"),
        "need a context of 22",
        "built for a context of 8",
    )
    one_line_error(run_cli("build", "--model", good_model, "--ctx", "100000"), "max_position_embeddings")


def test_prompt_errors(good_model):
    one_line_error(run_cli("run", "--model", good_model, "--prompt", "hello"), "no tokenizer.json", "--prompt-ids")
    one_line_error(run_cli("run", "--model", good_model, "--prompt-ids", "1,x"), "--prompt-ids")
    one_line_error(run_cli("run", "--model", good_model, "--prompt-ids", "1,99999"), "outside the vocabulary")
    one_line_error(run_cli("run", "--model", good_model), "give a prompt")


NOT_UTF8 = b"\xff\xfeIn the beginning\n"


def cli_with_stdin(*args, stdin: bytes):
    import subprocess
    import sys

    from conftest import REPO

    done = subprocess.run(
        [sys.executable, "-m", "generator.cli", *map(str, args)],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        timeout=600,
    )
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def test_text_that_is_not_utf8_is_one_line(tmp_path):
    """Bytes that are not UTF-8 in --prompt (Python hands them over as lone surrogates), on
    --prompt-file's standard input and on chat's: one line each, not a TypeError from the tokenizer."""
    from conftest import DEFAULT_MODEL

    out = tmp_path / "out"
    run = ("run", "--model", DEFAULT_MODEL, "--steps", "2", "--out", out)
    one_line_error(run_cli(*run, "--prompt", "\udcff\udcfeIn the beginning"), "--prompt: not UTF-8 text")
    one_line_error(
        cli_with_stdin(*run, "--prompt-file", "-", stdin=NOT_UTF8),
        "--prompt-file - (standard input): not UTF-8 text",
    )
    assert not out.exists()
    (tmp_path / "chat.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    chat = ("chat", "--model", DEFAULT_MODEL, "--chat-template", tmp_path / "chat.jinja", "--steps", "2")
    one_line_error(
        cli_with_stdin(*chat, "--out", out, stdin=b"In the beginning\n" + NOT_UTF8),
        "standard input, line 2: not UTF-8 text",
    )


def test_verify_passes_and_reports_json(good_model):
    done = run_cli("verify", "--model", good_model, "--prompt-ids", "1,2,3", "--steps", "6", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["pass"] is True and result["first_divergent_step"] is None
    assert result["firmware"]["logits_sha256"] == result["reference"]["logits_sha256"]


@pytest.mark.parametrize(
    "setting,fragment",
    [
        ({"temperature": "1e400"}, "temperature must be a finite number >= 0"),  # JSON's way to infinity
        ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"min_p": 2.0}, "min_p must be in [0, 1]"),
        ({"top_k": 2.5}, "top_k must be an integer"),
    ],
)
def test_generation_config_sampling_values_are_range_checked(good_model, setting, fragment):
    text = json.dumps({"do_sample": True, **setting}).replace('"1e400"', "1e400")
    (good_model / "generation_config.json").write_text(text)
    one_line_error(
        run_cli("run", "--model", good_model, "--prompt-ids", "1,2,3", "--steps", "3"),
        "generation_config.json",
        fragment,
    )


def test_generation_config_top_k_of_minus_one_means_off_on_board_and_reference_alike(good_model):
    """The board used to refuse top_k=-1 while the reference treated it as off."""
    (good_model / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.9, "top_k": -1}))
    done = run_cli("verify", "--model", good_model, "--prompt-ids", "1,2,3", "--steps", "6", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["pass"] and summary["sampling"]["top_k"] == 0


def test_a_reader_that_goes_away_ends_the_cli_quietly():
    """`./colibri --version | head -1`: the pipe closes under the CLI; it stops with the shell's
    status for SIGPIPE, without a traceback."""
    import subprocess

    from conftest import REPO

    proc = subprocess.Popen([str(REPO / "colibri"), "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before Python has started: its first write meets a closed pipe
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr
