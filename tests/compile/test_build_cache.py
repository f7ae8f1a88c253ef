"""The build cache (generator/compile/build_cache.py): a firmware compiled once is taken from the
cache by a build of the same inputs in another directory, byte for byte; a changed source is
compiled again; the cache can be turned off, trimmed and emptied, and never touches files that
are not its own."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import DEFAULT_MODEL, REPO, run_cli

from generator.compile import build_cache
from generator.errors import ColibriError


def build_lines(out, *extra):
    done = run_cli("build", "--model", DEFAULT_MODEL, "--ctx", "64", "--out", out, *extra)
    assert done.returncode == 0, done.stderr
    return [line.split()[0] for line in done.stderr.splitlines() if line.startswith("  ") and line.split()]


def test_a_second_build_directory_takes_every_object_from_the_cache(tmp_path):
    """The test run's own cache (tests/conftest.py): whichever test built kjv-tiny first compiled it."""
    build_lines(tmp_path / "a")
    second = build_lines(tmp_path / "b")
    assert "CC" not in second and "LINK" not in second and second.count("CACHED") >= 20, second
    assert (tmp_path / "a" / "firmware").read_bytes() == (tmp_path / "b" / "firmware").read_bytes()


@pytest.mark.slow  # a whole compile of the firmware by design (about 35 s): the full tier only
def test_with_the_cache_off_everything_is_compiled_to_the_bytes_the_cache_serves(tmp_path):
    lines = build_lines(tmp_path / "off", "--cache-dir", "off")
    assert "CACHED" not in lines and lines.count("CC") >= 20
    # The suite's one whole compile from source of the default firmware: what the cache serves to
    # every other build must be these very bytes.
    build_lines(tmp_path / "cached")
    for rel in ("firmware", "generated/model_def.h", "generated/model_data.c", "generated/weights.img"):
        assert (tmp_path / "off" / rel).read_bytes() == (tmp_path / "cached" / rel).read_bytes(), rel


def test_a_directory_of_other_files_is_refused_as_a_cache(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    done = run_cli("build", "--model", DEFAULT_MODEL, "--out", tmp_path / "out", "--cache-dir", tmp_path)
    assert done.returncode == 2 and done.stderr.strip().endswith("not a build cache (give an empty one)")
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "out").exists()
    done = run_cli("clean", "--cache", "--cache-dir", tmp_path)
    assert done.returncode == 2 and "is not a build cache" in done.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"


def fake_cache(root, sizes):
    """A cache as SCons lays it out: entries named by signature in two-character folders."""
    root.mkdir()
    (root / "CACHEDIR.TAG").write_bytes(build_cache.CACHEDIR_SIGNATURE + b"\n")
    (root / "config").write_text('{"prefix_len": 2}')
    entries = []
    for i, size in enumerate(sizes):
        name = f"{i:02X}{'0' * 30}"
        (root / name[:2]).mkdir(exist_ok=True)
        entry = root / name[:2] / name.lower()
        entry.write_bytes(b"x" * size)
        os.utime(entry, (1_000_000 + i, 1_000_000 + i))  # older first
        entries.append(entry)
    return entries


def test_trimming_removes_the_least_recently_used_entries_and_nothing_else(tmp_path):
    entries = fake_cache(tmp_path / "cache", [1000, 1000, 1000, 1000])
    stray = tmp_path / "cache" / "00" / "README"
    stray.write_text("not an entry")
    assert build_cache.trim_cache(tmp_path / "cache", limit=2500) == 2000
    assert [e.exists() for e in entries] == [False, False, True, True] and stray.exists()
    assert build_cache.cache_bytes(tmp_path / "cache") == 2000


def test_clean_cache_empties_it(tmp_path):
    entries = fake_cache(tmp_path / "cache", [10, 20])
    done = run_cli("clean", "--cache", "--cache-dir", tmp_path / "cache", "--board", "host", "--json")
    assert done.returncode == 0, done.stderr
    assert not any(e.exists() for e in entries) and build_cache.is_cache(tmp_path / "cache")
    assert '"cache_bytes": 30' in done.stdout


@pytest.mark.parametrize("value", ["off", "OFF", "none", ""])
def test_off_turns_the_cache_off(value, monkeypatch):
    assert build_cache.resolve_cache_dir(value) is None
    monkeypatch.setenv("COLIBRI_CACHE_DIR", value)
    assert build_cache.resolve_cache_dir(None) is None


def test_the_default_cache_is_the_users(monkeypatch, tmp_path):
    monkeypatch.delenv("COLIBRI_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert build_cache.resolve_cache_dir(None) == tmp_path / "colibri" / "build-cache"


def test_a_bad_size_limit_is_one_line(monkeypatch):
    monkeypatch.setenv("COLIBRI_CACHE_MAX_MB", "lots")
    with pytest.raises(ColibriError, match="^COLIBRI_CACHE_MAX_MB must be a whole number of MiB, got 'lots'$"):
        build_cache.max_cache_bytes()


def test_a_cached_object_is_not_taken_for_a_changed_source(tmp_path, monkeypatch):
    """The key is the inputs' contents: a checkout whose runtime differs compiles that file again."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("SConstruct", "generator", "templates", "firmware_src", "targets", "models/kjv-tiny"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(src, checkout / name)
    build_lines(tmp_path / "first")  # the repository's own build, cached
    sampler = checkout / "firmware_src" / "runtime" / "sampler.c"
    sampler.write_text(sampler.read_text() + "\n/* changed */\n")
    done = run_cli("build", "--model", DEFAULT_MODEL, "--ctx", "64", "--out", tmp_path / "second", cwd=checkout)
    assert done.returncode == 0, done.stderr
    compiled = [line.split()[-1] for line in done.stderr.splitlines() if line.startswith("  CC ")]
    assert compiled == ["firmware_src/runtime/sampler.c"], compiled


def test_a_test_define_recompiles_only_the_files_that_name_it(tmp_path):
    """A diagnostic build (defines=, as tests make slower loaders or damaged self-tests) compiles
    again only the sources naming the macro; the rest comes from the cache (SConstruct: a macro no
    firmware file names, such as NDEBUG, still goes to every compile command)."""
    import json

    from generator.boards import load_board
    from generator.compile.build import prepare, run_scons

    build_lines(tmp_path / "plain")  # the cache holds the default firmware
    req, _ = prepare(load_board("host"), DEFAULT_MODEL, None, 64, tmp_path / "check-all")
    run_scons(req, defines=("COLIBRI_SELFTEST_CHECK_ALL",))
    entries = json.loads((req.out_dir / "compile_commands.json").read_text())
    assert [Path(e["file"]).name for e in entries if "COLIBRI_SELFTEST_CHECK_ALL" in e["command"]] == ["selftest.c"]
