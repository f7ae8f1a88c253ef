"""./colibri run from another directory keeps the caller's working directory: relative paths
(--model, --out, --text) resolve where the user stands, colibri.toml is found there first, and the
checkout's own files (firmware_src/, targets/, SConstruct) are found from the package's location."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import DEFAULT_MODEL, REPO


def wrapper(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(REPO / "colibri"), *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.slow
def test_the_wrapper_resolves_paths_and_colibri_toml_where_the_user_stands(tmp_path):
    """One build of the default model as the commands build it (its objects come from the run's
    build cache when another test built it: about 10 s, most of it start-up), run and eval on it."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "my-copy").symlink_to(DEFAULT_MODEL)
    (tmp_path / "colibri.toml").write_text("[run]\nsteps = 4\n")
    (tmp_path / "small.txt").write_text("In the beginning God created the heaven and the earth. " * 16)

    ran = wrapper(tmp_path, "run", "--model", "models/my-copy", "--out", "mybuild", "--prompt-ids", "1,2", "--json")
    assert ran.returncode == 0, ran.stderr
    assert f"settings from {tmp_path / 'colibri.toml'}: steps = 4" in ran.stderr
    assert (tmp_path / "mybuild" / "firmware").is_file() and not (REPO / "mybuild").exists()
    decoded = json.loads(ran.stdout)
    assert decoded["prompt"] == [1, 2] and len(decoded["tokens"]) == 4

    evaluated = wrapper(tmp_path, "eval", "--model", "models/my-copy", "--out", "mybuild", "--text", "small.txt")
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout.startswith("PPL = ")
