"""--model hf:ORG/NAME: a model by its name, fetched through huggingface_hub into its cache from a
hub on 127.0.0.1 that serves a random-init checkpoint and a GGUF file of it (tests/hub_server.py);
offline it comes from the cache and the network is never used; what the hub refuses is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from hub_server import FakeHub, Repository

from generator.files import DEFAULT_MODEL
from generator.model.load import load_model

# The door's answer for each value: its path, or the error's one line.
RESOLVE = """
import sys
from generator.errors import ColibriError
from generator.model.load import model_path, model_value
for value in sys.argv[1:]:
    try:
        print(model_path(model_value(value)))
    except ColibriError as e:
        print(f"error: {e}")
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The bundled kjv-tiny checkpoint (no torch needed to make one) and a Q8_0 GGUF file of it."""
    from gguf_files import hf_to_gguf

    gguf = hf_to_gguf(DEFAULT_MODEL, tmp_path_factory.mktemp("hub-gguf") / "tiny-Q8_0.gguf", "Q8_0").read_bytes()
    checkpoint = {p.name: p.read_bytes() for p in DEFAULT_MODEL.iterdir() if p.is_file()}
    repositories = {
        "colibri/kjv-tiny": Repository(
            {"main": {**checkpoint, "README.md": b"# tiny"}, "v1": {**checkpoint, "NOTES.md": b"first release"}}
        ),
        "colibri/tiny-GGUF": Repository({"main": {"tiny-Q8_0.gguf": gguf, "tiny-Q4_0.gguf": b"never fetched"}}),
        "colibri/two-GGUF": Repository({"main": {"a-Q8_0.gguf": b"", "b-Q8_0.gguf": b""}}),
        "colibri/gated": Repository({"main": {"tiny-Q8_0.gguf": gguf}}, gated=True),
    }
    with FakeHub(repositories, private={"colibri/private"}) as server:
        yield server


def resolve(hub: FakeHub, cache: Path, *values: str, offline: bool = False, endpoint: str | None = None) -> list[str]:
    """The door's answer for each value (a path, or "error: ..."), in one process of its own as a
    command sees it (huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE when imported)."""
    env = {**os.environ, "HF_ENDPOINT": endpoint or hub.url, "HF_HUB_CACHE": str(cache)}
    env["HF_HUB_OFFLINE"] = "1" if offline else "0"
    env.pop("HF_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE, *values], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout.splitlines()


def test_a_checkpoint_and_a_revision_are_fetched_into_the_cache_then_reused_offline(hub, tmp_path):
    commit = hub.repositories["colibri/kjv-tiny"].commit("v1")
    main, tagged = map(Path, resolve(hub, tmp_path, "hf:colibri/kjv-tiny", "hf:colibri/kjv-tiny@v1"))
    assert main.is_dir() and main.is_relative_to(tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in main.iterdir()}
    assert not (main / "README.md").exists()  # only what the model stage reads is fetched
    assert load_model(main, load_tensors=False).spec == load_model(DEFAULT_MODEL, load_tensors=False).spec
    assert tagged.name == commit and main.name != commit

    asked = len(hub.requests)
    offline = resolve(
        hub, tmp_path, "hf:colibri/kjv-tiny", "hf:colibri/kjv-tiny@v1", f"hf:colibri/kjv-tiny@{commit}", offline=True
    )
    assert offline == [str(main), str(tagged), str(tagged)]
    assert len(hub.requests) == asked  # HF_HUB_OFFLINE: the cache, never the network


def test_a_gguf_file_is_chosen_by_its_quant(hub, tmp_path):
    [path] = map(Path, resolve(hub, tmp_path, "hf:colibri/tiny-GGUF:q8_0"))
    assert path.name == "tiny-Q8_0.gguf" and load_model(path, load_tensors=False).spec.vocab_size == 512
    assert not any("tiny-Q4_0" in r for r in hub.requests)
    # The hub unreachable: what the cache holds still answers.
    assert resolve(hub, tmp_path, "hf:colibri/tiny-GGUF:Q8_0", endpoint="http://127.0.0.1:9") == [str(path)]


REFUSED = {
    "hf:colibri/two-GGUF:Q8_0": "2 GGUF files with Q8_0 in its name (its GGUF files: a-Q8_0.gguf, b-Q8_0.gguf); "
    "name one with :FILE.gguf",
    "hf:colibri/tiny-GGUF:Q5_K_M": "no GGUF file with Q5_K_M in its name (its GGUF files: tiny-Q4_0.gguf, "
    "tiny-Q8_0.gguf); name one with :FILE.gguf",
    "hf:colibri/tiny-GGUF:tiny.gguf": "the repository has no file tiny.gguf (its GGUF files: tiny-Q4_0.gguf, "
    "tiny-Q8_0.gguf)",
    "hf:colibri/tiny-GGUF": "several GGUF files (tiny-Q4_0.gguf, tiny-Q8_0.gguf): choose one with :QUANT or :FILE.gguf",
    "hf:colibri/gated": "the repository is gated: accept its terms on {url}/colibri/gated and log in "
    "(hf auth login, or set HF_TOKEN)",
    "hf:colibri/nothing": "no such repository on {url} (or it is private: log in with hf auth login, or set HF_TOKEN)",
    "hf:colibri/private": "no such repository on {url} (or it is private: log in with hf auth login, or set HF_TOKEN)",
    "hf:colibri/kjv-tiny@v9": "the repository has no revision 'v9' on {url}",
}


def test_what_the_hub_refuses_is_one_line(hub, tmp_path):
    said = resolve(hub, tmp_path, *REFUSED)
    assert said == [f"error: {value}: {why.format(url=hub.url)}" for value, why in REFUSED.items()]
    offline = resolve(hub, tmp_path, "hf:colibri/nothing", offline=True)
    assert offline == [
        f"error: hf:colibri/nothing: HF_HUB_OFFLINE is set, and the cache ({tmp_path}) does not hold this revision"
    ]


def test_the_command_says_it_in_one_line_and_exits_2(tmp_path, monkeypatch):
    """Through ./colibri as a user runs it: no traceback, exit 2 (the hub unreachable, nothing cached)."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    done = run_cli("run", "--model", "hf:colibri/kjv-tiny", "--prompt-ids", "1", "--steps", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "colibri: error: hf:colibri/kjv-tiny: the hub cannot be reached ([Errno 111] Connection refused), "
        f"and the cache ({tmp_path}) does not hold this revision"
    )


def test_colibri_toml_names_a_model_on_the_hub_as_the_command_line_does(tmp_path, monkeypatch):
    from generator.cli import parse_args
    from generator.model.hub import HubReference

    (tmp_path / "colibri.toml").write_text('model = "hf:colibri/kjv-tiny@v1:Q8_0"\n')
    monkeypatch.chdir(tmp_path)
    # Not a path relative to the file: the reference, fetched when the command runs.
    assert parse_args(["run"]).model == HubReference("colibri/kjv-tiny", "v1", "Q8_0")


def test_a_malformed_name_is_a_usage_error(capsys):
    from generator.cli import main

    for value in ("hf:no-slash", "hf:org/name:Q4_K_M:more", "hf:org/name@", "hf:org/name:sub/dir.gguf"):
        with pytest.raises(SystemExit) as exited:
            main(["run", "--model", value, "--prompt-ids", "1"])
        assert exited.value.code == 2
        assert f"{value!r} is not a model on the hub: write hf:ORG/NAME" in capsys.readouterr().err


@pytest.mark.parametrize("show", [True, False])
def test_a_download_shows_huggingface_hubs_progress_on_a_terminal_and_nothing_with_json(hub, tmp_path, show):
    """stderr a terminal (a pty): the file's progress bar, as huggingface_hub draws it; --json
    (show_progress False): nothing at all."""
    import fcntl
    import pty
    import struct
    import termios

    script = (
        "import sys; from generator.model.load import model_path, model_value; "
        f"model_path(model_value(sys.argv[1]), show_progress={show})"
    )
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal's size, as tqdm asks
    done = subprocess.run(
        [sys.executable, "-c", script, "hf:colibri/tiny-GGUF:Q8_0"], cwd=REPO, env=env, stderr=terminal, timeout=60
    )
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal's other end is closed: all of it read
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert done.returncode == 0, shown
    assert (b"tiny-Q8_0.gguf" in shown and b"100%" in shown) if show else shown == b"", shown
