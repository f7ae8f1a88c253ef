"""The CLI and a firmware as the tests run them: a command's options given as keywords, its JSON
checked (`./colibri verify` to pass), or a built firmware on its board with one request, checked
against the NumPy reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import run_cli

from generator.device.runner import run_on_board
from generator.device.session import RunRequest
from generator.numerics.sampling import SamplingParams
from generator.verify import compare, reference_run


def cli_options(**settings: object) -> list[str]:
    """`--name value` for each setting, in order (underscores as dashes); True gives the flag alone."""
    args: list[str] = []
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


def model_copy(checkpoints, kind: str, into: Path) -> Path:
    """A copy of the session's `kind` checkpoint at `into`, for a test to damage or rename."""
    shutil.copytree(checkpoints(kind), into)
    return into


def main_json(capsys, command: str, **settings: object) -> dict:
    """The CLI's main in this process, --json: it must return 0; its JSON document."""
    from generator.cli import main

    assert main([command, *cli_options(**settings), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def cli_build_refused(model: Path, out: Path) -> str:
    """./colibri build of model into out, as a user runs it: exit status 2, no traceback, nothing
    built, and one error line, which it returns."""
    done = run_cli("build", "--model", model, "--out", out)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("colibri: error: "), done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
    return lines[0]


def build_refused(capsys, model: Path, out: Path) -> str:
    """build of model into out in this process: exit status 2, nothing built, and one error line,
    which it returns."""
    from generator.cli import main

    capsys.readouterr()
    assert main(["build", "--model", str(model), "--out", str(out)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("colibri: error: "), lines
    assert not out.exists()
    return lines[0]


def damaged_key_refused(capsys, source: Path, key: str, value: int | None, tmp_path: Path) -> str:
    """source's GGUF with its metadata key set to a u32 value (None: removed), as damaged.gguf: built,
    refused with one line naming the file, which it returns."""
    from gguf_files import with_u32_key

    line = build_refused(capsys, with_u32_key(source, key, value, tmp_path / "damaged.gguf"), tmp_path / "out")
    assert line.startswith("colibri: error: damaged.gguf: "), line
    return line


def verify_passes(out: Path, timeout: int = 600, **settings: object) -> dict:
    """verify with these settings, --json, into out: its JSON, which must say the run passed."""
    done = run_cli("verify", *cli_options(**settings), "--json", "--out", out, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["pass"], summary
    return summary


def run_prompt(board, art, prompt, steps, sampling=SamplingParams(), threads=1, budget=0):
    """The request (past the end of text: stop_at_eos off) and the board's result, from art's build."""
    request = RunRequest(prompt, steps, sampling, stop_at_eos=False, threads=threads, memory_budget=budget)
    return request, run_on_board(
        board, art.program, art.weights, request, art.model_hash(), flash_image=art.flash_image
    )


def assert_decodes_as_the_reference(plan, art, request, result, ref=None):
    """The board's run against the reference's decode of the same image (given, or made here): the
    same tokens, logits digests and expert counts."""
    ref = ref or reference_run(plan, art.weights, request)
    assert compare(result, ref).passed
    assert result.tokens == ref.tokens and result.digests == ref.digests
    assert result.expert_counts == ref.expert_counts
