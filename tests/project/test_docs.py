"""The documentation follows the tree: docs/architecture.md names every module and firmware source,
docs/image-format.md's tables are image_format.py's, every relative link in README.md and docs/
resolves (file and heading), and no internal issue numbers remain in them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

DOCS = REPO / "docs"
ARCHITECTURE = (DOCS / "architecture.md").read_text()
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def named(path: str, text: str) -> bool:
    """`path` appears in `text` as a whole path (not as the tail of a longer one)."""
    return re.search(r"(?<![\w/.-])" + re.escape(path) + r"(?![\w/-]|\.\w)", text) is not None


def sources(root: Path, suffixes: tuple[str, ...]) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in suffixes and p.is_file())


def test_the_walk_finds_modules():
    assert "compile/plan.py" in sources(REPO / "generator", (".py",))
    assert "runtime/kernels/kernels.h" in sources(REPO / "firmware_src", (".c", ".h"))
    assert named("compile/plan.py", "| `compile/plan.py` |")
    assert not named("plan.py", "| `compile/plan.py` |") and not named("model.c", "runtime/model.cpp")


@pytest.mark.parametrize("root, suffixes", [("generator", (".py",)), ("firmware_src", (".c", ".h"))])
def test_architecture_names_every_module(root, suffixes):
    missing = [p for p in sources(REPO / root, suffixes) if not named(p, ARCHITECTURE)]
    assert missing == [], (
        f"docs/architecture.md does not name these files under {root}/ (one line each, by their path "
        f"relative to {root}/): {', '.join(missing)}"
    )


def test_architecture_names_no_file_that_is_gone():
    listed = re.findall(r"^\| `([\w/.-]+\.(?:py|c|h|S|ld))` \|", ARCHITECTURE, flags=re.M)
    assert listed, "no module tables found"
    gone = [p for p in listed if not (REPO / "generator" / p).is_file() and not (REPO / "firmware_src" / p).is_file()]
    assert gone == [], f"docs/architecture.md lists files that do not exist: {', '.join(gone)}"


def test_architecture_states_the_import_rule_of_test_architecture():
    from test_architecture import STAGES

    table = ARCHITECTURE[ARCHITECTURE.index("| floor | modules | may import |") :]
    rows = [line for line in table.split("\n\n")[0].splitlines()[2:]]
    assert len(rows) == len(STAGES)
    for row, stage in zip(rows, STAGES):
        cell = row.split("|")[2]
        documented = {m.rstrip("/").removesuffix(".py") for m in re.findall(r"`([\w/.]+)`", cell)}
        assert documented == set(stage), row


def test_image_format_tables_are_image_format_py():
    from generator.compile import image_format as f

    text = (DOCS / "image-format.md").read_text()
    for title, table in (
        (f"### Header ({f.HEADER_BYTES} bytes)", f.HEADER),
        (f"### Directory entry ({f.DIR_ENTRY_BYTES} bytes)", f.DIR_ENTRY),
    ):
        section = text[text.index(title) :]
        section = section[section.index("| offset |") :].split("\n\n")[0]
        rows = [tuple(c.strip() for c in line.strip("|").split("|")) for line in section.splitlines()[2:]]
        assert rows == [(str(x.offset), str(x.size), f"`{x.name}`", x.doc) for x in table.values()]
    for name, code in f.DTYPE_CODES.items():
        assert f"`{name}` = {code}" in text


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    text = page.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(target)
    assert broken == [], f"{page.relative_to(REPO)}: links that lead nowhere: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_internal_issue_numbers(page):
    found = re.findall(r".{0,30}(?:issue [0-9]+|#[0-9]{2}\b).{0,30}", page.read_text(), flags=re.I)
    assert found == [], f"{page.relative_to(REPO)} names internal issues: {found}"
