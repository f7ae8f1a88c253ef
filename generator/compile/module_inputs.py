"""Which generator modules a build step runs on, read from their import statements with `ast`
(never by importing them): SConstruct names exactly these as a step's inputs, so editing a module
the step does not import (cli.py, bench.py) rebuilds nothing, and tests/project/test_architecture.py
checks the same graph for cycles and stage order."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

GENERATOR = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    """`compile.plan` for generator/compile/plan.py; `__init__` for the package's own file."""
    parts = path.relative_to(GENERATOR).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__") or "__init__"


def module_path(name: str) -> Path | None:
    if name == "__init__":
        return GENERATOR / "__init__.py"
    base = GENERATOR.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _statements(tree: ast.Module):
    """Every statement of a module, at any depth (in functions, classes, branches, handlers), but
    no expression: an import is a statement, and a module has some fifty times more expression
    nodes than statements (ast.walk over them was most of a no-op build's time)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            todo += getattr(node, field, ())


def imports_of(path: Path) -> frozenset[str]:
    """Modules of the generator that `path` imports (at the top or inside functions). Read once per
    process and version of the file: a build asks for the same modules' imports for each of its
    steps."""
    st = path.stat()
    return _imports_of(path, st.st_mtime_ns, st.st_size, GENERATOR)


@functools.lru_cache(maxsize=None)
def _imports_of(path: Path, _mtime_ns: int, _size: int, _generator: Path) -> frozenset[str]:
    name = module_name(path)
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    found = set()
    for node in _statements(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("generator"):
                target = node.module[len("generator.") :] if node.module != "generator" else ""
            else:
                continue
            if node.level and not module_path(target or "__init__"):
                # Python would fail on it when the module runs; the walk must not drop it silently
                # from a step's inputs first.
                raise ValueError(
                    f"{path.relative_to(GENERATOR)}:{node.lineno}: "
                    f"{'.' * node.level}{node.module or ''} is no module of the generator"
                )
            for alias in node.names:
                candidate = f"{target}.{alias.name}" if target else alias.name
                found.add(candidate if module_path(candidate) else target or "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("generator."):
                    found.add(alias.name[len("generator.") :])
    return frozenset(m for m in found if m and module_path(m))


def graph() -> dict[str, set[str]]:
    """Every generator module and the generator modules it imports."""
    return {module_name(p): imports_of(p) - {module_name(p)} for p in sorted(GENERATOR.rglob("*.py"))}


def _packages_of(name: str) -> list[str]:
    # Importing compile.esp32.image first runs generator/, compile/ and compile/esp32/'s __init__.py.
    parts = name.split(".")
    return ["__init__"] + [".".join(parts[:i]) for i in range(1, len(parts))]


def modules_run_by(*modules: str) -> list[Path]:
    """The files of `modules` (dotted names as `__name__` gives them, e.g. "generator.compile.pipeline")
    and of every generator module they import, transitively, with the packages' __init__.py files."""
    todo = [m.removeprefix("generator.") if m != "generator" else "__init__" for m in modules]
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = module_path(name)
        if path is None:
            raise ValueError(f"{name} is not a module of the generator")
        seen[name] = path
        todo += _packages_of(name) + sorted(imports_of(path))
    return sorted(seen.values())
