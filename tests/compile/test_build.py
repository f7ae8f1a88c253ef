"""The SCons graph: the CLI and plain scons build the same artifacts; a second build does
nothing; a changed input rebuilds exactly what depends on it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from generator.compile.build import generation_modules

pytestmark = pytest.mark.slow  # full SCons builds, incremental rebuilds checked

SCONS = str(Path(sys.executable).parent / "scons")


def scons(root: Path, model: Path, out: Path, *extra):
    """Plain scons, with the test run's build cache (tests/conftest.py), as the CLI builds: the
    runtime's objects that no edit touched come from the cache (their lines say CACHED, not CC),
    so each chain compiles only what its own edits and its model change."""
    cache = [f"cache_dir={os.environ['COLIBRI_CACHE_DIR']}"]
    done = subprocess.run(
        [
            SCONS,
            "-Q",
            "-C",
            str(root),
            "board=host",
            f"model={model}",
            "quant=q8_0",
            "ctx=48",
            f"out={out}",
            *cache,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [
        line.strip()
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip().startswith(("GEN", "CC", "LINK"))
    ]


@pytest.fixture
def repo_copy(tmp_path):
    """A private copy of the sources, so the test can edit templates and generator modules."""
    root = tmp_path / "repo"
    for name in ("SConstruct", "generator", "templates", "targets", "firmware_src"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            root.mkdir(exist_ok=True)
            shutil.copy2(src, root / name)
    return root


def append(path: Path, text: str):
    path.write_text(path.read_text() + text)


def test_second_build_does_nothing_and_changes_rebuild_what_depends_on_them(repo_copy, checkpoints, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(checkpoints("llama_gqa_linear"), model)
    out = tmp_path / "out"

    first = scons(repo_copy, model, out)
    assert any(c.startswith("GEN") for c in first) and any("model_data.c" in c for c in first)
    assert first[-1].startswith("LINK")
    assert scons(repo_copy, model, out) == []
    check = subprocess.run(
        [SCONS, "-Q", "-q", "-C", str(repo_copy), "board=host", f"model={model}", "quant=q8_0", "ctx=48", f"out={out}"],
        capture_output=True,
    )
    assert check.returncode == 0, "scons --question says something is out of date"

    append(
        repo_copy / "firmware_src" / "runtime" / "ops.c",
        "\nint ops_edited(void);\nint ops_edited(void) { return 1; }\n",
    )
    assert scons(repo_copy, model, out) == ["CC      firmware_src/runtime/ops.c", f"LINK    {out}/firmware"]

    append(repo_copy / "templates" / "model_data.c.j2", "/* edited template */\n")
    rebuilt = scons(repo_copy, model, out)
    assert rebuilt[0].startswith("GEN")
    assert [c for c in rebuilt if c.startswith("CC")] == [f"CC      {out}/generated/model_data.c"]

    append(repo_copy / "generator" / "compile" / "plan.py", "\n# edited generator module\n")
    assert scons(repo_copy, model, out) == [f"GEN     {out}/generated"]  # same output: nothing recompiled
    # A module of every package generation imports from counts: the inputs follow the imports.
    first_of_package = {}
    for path in generation_modules():
        first_of_package.setdefault(path.parent, path.relative_to(REPO))
    assert len(first_of_package) >= 4  # generator/, model/, numerics/, compile/
    for module in first_of_package.values():
        append(repo_copy / module, "\n# edited\n")
        assert scons(repo_copy, model, out) == [f"GEN     {out}/generated"], module

    config = model / "config.json"
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 2e-05'))
    rebuilt = scons(repo_copy, model, out)
    assert rebuilt[0].startswith("GEN")
    assert len([c for c in rebuilt if c.startswith("CC")]) >= 5  # every file that includes model_def.h

    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # same bytes, new timestamp: content decides
    assert scons(repo_copy, model, out) == []


def test_editing_a_module_generation_does_not_import_regenerates_nothing(repo_copy, checkpoints, tmp_path):
    model = checkpoints("llama_gqa_linear")
    out = tmp_path / "out"
    scons(repo_copy, model, out)
    image = out / "generated" / "weights.img"
    written = image.stat()

    # The CLI and the benchmark run on top of the build: quantizing again for them is wasted time.
    for module in ("cli.py", "bench/run.py"):
        append(repo_copy / "generator" / module, "\n# edited, not imported by generation\n")
        assert scons(repo_copy, model, out) == [], module
    assert (image.stat().st_ino, image.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)

    append(repo_copy / "generator" / "numerics" / "quantize.py", "\n# edited\n")
    assert scons(repo_copy, model, out) == [f"GEN     {out}/generated"]
    assert image.stat().st_mtime_ns != written.st_mtime_ns  # written again


def test_cli_build_and_plain_scons_give_identical_artifacts(checkpoints, tmp_path):
    """The CLI is a way to run the build, not another build: plain scons gives the same bytes.
    (That the cache serves what a compile from source gives: test_build_cache.py's cache-off test.)"""
    model = checkpoints("mistral_window")
    done = run_cli("build", "--model", model, "--ctx", "48", "--out", tmp_path / "cli", "--json")
    assert done.returncode == 0, done.stderr
    scons(REPO, model, tmp_path / "direct")
    for rel in (
        "generated/model_def.h",
        "generated/model_data.c",
        "generated/weights.img",
        "generated/plan.json",
        "firmware",
    ):
        assert (tmp_path / "cli" / rel).read_bytes() == (tmp_path / "direct" / rel).read_bytes(), rel


def test_every_build_writes_a_compilation_database_for_editors(checkpoints, tmp_path):
    import json

    out = tmp_path / "out"
    scons(REPO, checkpoints("llama_gqa_linear"), out)
    entries = json.loads((out / "compile_commands.json").read_text())
    by_file = {Path(e["file"]).resolve(): e for e in entries}
    model_c = (REPO / "firmware_src" / "runtime" / "model.c").resolve()
    assert model_c in by_file and (out / "generated" / "model_data.c").resolve() in by_file
    entry = by_file[model_c]
    assert Path(entry["directory"]).is_absolute()
    # The generated headers are on the include path, so an editor resolves model_def.h's constants.
    assert f"-I{out / 'generated'}" in entry["command"] and (out / "generated" / "model_def.h").is_file()
    assert "-ffp-contract=off" in entry["command"]
    assert all(Path(e["file"]).is_file() for e in entries)
    assert scons(REPO, checkpoints("llama_gqa_linear"), out) == []  # and it costs no rebuild


def test_the_latest_default_build_is_where_clangd_looks(tmp_path):
    from generator.compile.build import link_compile_commands

    build_root = tmp_path / "build"
    for board in ("host", "qemu-rv32"):
        out = build_root / board / "m-q8_0-ctx64"
        out.mkdir(parents=True)
        (out / "compile_commands.json").write_text(f'["{board}"]')
        link_compile_commands(out, build_root)
        assert (build_root / "compile_commands.json").read_text() == f'["{board}"]'
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "compile_commands.json").write_text("[]")
    link_compile_commands(elsewhere, build_root)  # a build outside build/ does not take the link
    assert (build_root / "compile_commands.json").read_text() == '["qemu-rv32"]'
