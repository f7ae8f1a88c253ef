"""The generator's house: stage packages whose imports point down the pipeline
(model -> numerics -> compile -> device -> verify/report/bench -> job -> release -> commands/cli), never in a circle,
on a ground floor every stage may use (errors, files, sizes, the boards)."""

from __future__ import annotations

import pytest

from generator.compile.module_inputs import GENERATOR, graph, modules_run_by

# Each stage, lowest first: a module may import its own stage and the ones below it.
STAGES = [
    ("errors", "files", "__init__", "project_file", "sizes", "boards", "console", "documents"),
    ("model",),
    ("numerics",),
    ("compile",),
    ("device",),
    ("reference",),
    ("verify", "verify_localise", "report", "chat", "evaluate", "selftest"),
    ("bench",),
    ("job", "option_checks", "flash_job"),
    ("release",),
    ("cli", "arguments", "commands"),
]


def stage_of(module: str) -> int:
    top = module.split(".")[0]
    return next(i for i, names in enumerate(STAGES) if top in names)


def test_there_is_no_import_cycle_in_the_generator():
    edges = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m, path):
        state[m] = 1
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                cycles.append(path[path.index(n) :] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_every_module_belongs_to_a_stage_and_imports_only_its_own_or_lower_stages():
    edges = graph()
    wrong = [f"{m} -> {n}" for m, targets in edges.items() for n in targets if stage_of(n) > stage_of(m)]
    assert wrong == []
    packages = {p.name for p in GENERATOR.iterdir() if (p / "__init__.py").is_file()}
    assert packages == {"boards", "model", "numerics", "compile", "device", "release", "bench", "commands"}


def test_the_boards_are_on_the_ground_floor():
    """boards/ imports nothing of the stages, and every stage may import it."""
    edges = graph()
    upward = [
        f"{m} -> {n}" for m, targets in edges.items() if m.startswith("boards") for n in targets if stage_of(n) != 0
    ]
    assert upward == []
    assert stage_of("boards") == 0 and any(m.startswith("boards") for m in edges["compile.plan"])


def test_the_walk_sees_relative_imports_inside_functions_too():
    edges = graph()
    assert "compile.plan" in edges["compile.build"]
    assert "device.setup_toolchain" in edges["release.make"]  # imported inside make_release
    assert "numerics.rope" in edges["compile.emit"]  # `from ..numerics import rope`


def test_generation_runs_on_what_it_imports_and_on_its_packages_not_on_the_commands_above_it():
    from generator.compile.build import generation_modules

    names = {p.relative_to(GENERATOR).as_posix() for p in generation_modules()}
    assert {"compile/pipeline.py", "numerics/quantize.py", "errors.py", "__init__.py", "model/__init__.py"} <= names
    assert not names & {"cli.py", "bench.py", "report.py", "compile/build.py"}
    assert {p.name for p in modules_run_by("generator.errors")} == {"errors.py", "__init__.py"}


def test_a_relative_import_that_names_no_module_is_an_error_not_a_missing_input(tmp_path, monkeypatch):
    """The walk decides SCons's inputs: an import it cannot place (a module moved, its importer not
    updated) must stop it, not leave the module out of a step's inputs."""
    from generator.compile import module_inputs

    package = tmp_path / "generator" / "compile"
    package.mkdir(parents=True)
    (tmp_path / "generator" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "moved.py").write_text("from ..boards.esp_idf import SECTOR\n")
    monkeypatch.setattr(module_inputs, "GENERATOR", tmp_path / "generator")
    with pytest.raises(ValueError, match=r"compile/moved.py:1: \.\.boards\.esp_idf is no module of the generator"):
        module_inputs.imports_of(package / "moved.py")
