"""The generator's house: stage packages whose imports point down the pipeline
(model -> numerics -> compile -> device -> verify/report/bench -> release -> cli), never in a circle,
on a ground floor every stage may use (errors, files, sizes, the boards)."""

from __future__ import annotations

import ast
from pathlib import Path

GENERATOR = Path(__file__).resolve().parent.parent / "generator"

# Each stage, lowest first: a module may import its own stage and the ones below it.
STAGES = [
    ("errors", "files", "__init__", "project_file", "sizes", "boards"),
    ("model",),
    ("numerics",),
    ("compile",),
    ("device",),
    ("reference",),
    ("verify", "report", "chat", "evaluate"),
    ("bench",),
    ("release",),
    ("cli", "option_checks"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(GENERATOR).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__") or "__init__"


def imports_of(path: Path) -> set[str]:
    """Modules of the generator that `path` imports (at the top or inside functions)."""
    name = module_name(path)
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("generator"):
                target = node.module[len("generator."):] if node.module != "generator" else ""
            else:
                continue
            for alias in node.names:
                candidate = f"{target}.{alias.name}" if target else alias.name
                found.add(candidate if module_path(candidate) else target or "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("generator."):
                    found.add(alias.name[len("generator."):])
    return {m for m in found if m and module_path(m)}


def module_path(name: str) -> Path | None:
    if name == "__init__":
        return GENERATOR / "__init__.py"
    base = GENERATOR.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) - {module_name(p)} for p in sorted(GENERATOR.rglob("*.py"))}


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
                cycles.append(path[path.index(n):] + [n])
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
    assert packages == {"boards", "model", "numerics", "compile", "device", "release"}


def test_the_boards_are_on_the_ground_floor():
    """boards/ imports nothing of the stages, and every stage may import it."""
    edges = graph()
    upward = [f"{m} -> {n}" for m, targets in edges.items() if m.startswith("boards")
              for n in targets if stage_of(n) != 0]
    assert upward == []
    assert stage_of("boards") == 0 and any(m.startswith("boards") for m in edges["compile.plan"])


def test_the_walk_sees_relative_imports_inside_functions_too():
    edges = graph()
    assert "compile.plan" in edges["compile.build"]
    assert "device.setup_toolchain" in edges["release.make"]  # imported inside make_release
    assert "numerics.rope" in edges["compile.emit"]  # `from ..numerics import rope`
