"""The documentation's Python examples run as written: README.md and every page under docs/.

The ```python blocks of one page run in order in one namespace (a later block may use what an
earlier one defined), in a fresh temporary folder. A ``print(...)  # text`` line, and the
comment lines right below a ``print(...)`` line without one (a loop's output), say what the
block prints: those lines must appear in its output, in that order.

A block that must not run is preceded by ``<!-- not run: why -->``; such markers are counted
(``NOT_RUN``), so a block cannot drop out of the tests unnoticed, and neither can a fence this
parser does not read as Python (every fence whose language looks like Python is counted
twice, by two different readings of the page).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import yaml

import prunekit

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]

# How many blocks carry a `<!-- not run: ... -->` marker, over all pages.
NOT_RUN = 0

_PYTHON = {"python", "py", "python3"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*not run:\s*(?P<why>.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced Python block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    not_run: str | None  # the marker's reason, or None when the block runs


def _language(info: str) -> str:
    """The first word of a fence's info string, lowered (`python`, `{.python}`, `py title=x`)."""
    words = info.strip().strip("{}").split()
    return words[0].lstrip(".").lower() if words else ""


def blocks_of(page: Path) -> list[Block]:
    """The fenced Python blocks of a page, nested fences and indented ones included."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = index + 1
        while end < len(lines):
            closing = _FENCE.match(lines[end])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            end += 1
        if _language(opening["info"]) in _PYTHON:
            body = [
                line[len(indent) :] if line.startswith(indent) else line
                for line in lines[index + 1 : end]
            ]
            marker = _MARKER.match(lines[index - 1]) if index > 0 else None
            found.append(
                Block(page, index + 1, "\n".join(body) + "\n", marker["why"] if marker else None)
            )
        index = end + 1
    return found


def _python_fences(page: Path) -> int:
    """Fence openings whose language looks like Python, counted by a plain search."""
    text = page.read_text(encoding="utf-8")
    return len(
        re.findall(r"^[ \t]*(?:`{3,}|~{3,})[ \t]*\{?\.?(?:python3?|py)\b", text, re.M | re.I)
    )


def expected_output(code: str) -> list[str]:
    """The lines a block says it prints, in order (see the module's docstring)."""
    wanted: list[str] = []
    lines = code.splitlines()
    for number, line in enumerate(lines):
        if "print(" not in line:
            continue
        if "#" in line:
            wanted.append(line.split("#", 1)[1].strip())
            continue
        for below in lines[number + 1 :]:
            if not below.startswith("#"):
                break
            wanted.append(below[1:].strip())
    return wanted


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


PYTHON_PAGES = [page for page in PAGES if blocks_of(page)]


def test_pages_found() -> None:
    names = {_name(page) for page in PYTHON_PAGES}
    assert "README.md" in names
    assert any(name.startswith("docs/guides/") for name in names), names


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_python_fence_is_read(page: Path) -> None:
    """No Python block escapes the runner: two readings of the page count the same blocks."""
    assert len(blocks_of(page)) == _python_fences(page)


def test_not_run_markers_are_counted() -> None:
    skipped = [block for page in PAGES for block in blocks_of(page) if block.not_run]
    where = [f"{_name(block.page)}:{block.line} ({block.not_run})" for block in skipped]
    assert len(skipped) == NOT_RUN, f"blocks marked not to run: {where}; update NOT_RUN"


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_name)
def test_page_runs(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = blocks_of(page)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    ran = 0
    for block in blocks:
        if block.not_run:
            continue
        where = f"{_name(page)}:{block.line}"
        exec(compile(block.code, where, "exec"), namespace)
        ran += 1
        printed = capsys.readouterr().out.splitlines()
        position = 0
        for want in expected_output(block.code):
            matches = [i for i in range(position, len(printed)) if printed[i].strip() == want]
            assert matches, (
                f"{where}: expected {want!r} in the output after line {position}: {printed}"
            )
            position = matches[0] + 1
    assert ran == len(blocks) - sum(1 for block in blocks if block.not_run)
    assert ran > 0


def test_readme_keeps_the_test_command() -> None:
    """.ci/run runs `make test`: the README's two commands stay the ones CI runs."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"^make test\b", readme, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def _documented() -> list[str]:
    """The names of prunekit the reference's ``::: prunekit.<path>`` lines document: the
    path's last name where the object there is ``prunekit.<name>`` itself (``report`` for
    ``prunekit.report.report``, the function over the module of that name)."""
    names: list[str] = []
    for page in sorted((DOCS / "reference").glob("*.md")):
        for path in re.findall(r"^::: (prunekit(?:\.\w+)+)\s*$", page.read_text("utf-8"), re.M):
            module, _, name = path.rpartition(".")
            found = getattr(importlib.import_module(module), name)
            if name in prunekit.__all__ and found is getattr(prunekit, name):
                names.append(name)
    return names


def test_reference_lists_every_public_name() -> None:
    """Each name of prunekit.__all__ has its entry in docs/reference/ (once), and no other."""
    public = set(prunekit.__all__) - {"__version__"}
    documented = _documented()
    assert sorted(public - set(documented)) == [], "add them to a page of docs/reference/"
    assert sorted(set(documented) - public) == []
    assert len(documented) == len(set(documented))


def _hook() -> ModuleType:
    """docs/hooks/reference_index.py, the build's hook that writes the reference's index."""
    spec = importlib.util.spec_from_file_location(
        "reference_index", DOCS / "hooks" / "reference_index.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_index_is_generated() -> None:
    """The index's tables are made from the pages and the docstrings: one row per entry of
    every reference page, named as prunekit exports it, with the docstring's first words."""
    hook = _hook()
    config = yaml.load((ROOT / "mkdocs.yml").read_text("utf-8"), Loader=yaml.BaseLoader)
    assert "docs/hooks/reference_index.py" in config["hooks"]
    index = (DOCS / "reference" / "index.md").read_text("utf-8")
    assert hook.MARKER in index and "| --- |" not in index, "the index's table is generated"
    pages = hook.reference_pages(config["nav"])
    assert sorted(pages) == sorted(
        f"reference/{p.name}" for p in (DOCS / "reference").glob("*.md") if p.name != "index.md"
    )
    tables = hook.index_tables(ROOT, DOCS, config["nav"])
    rows = [line for line in tables.splitlines() if line.startswith("| [`")]
    entries = [e for p in pages for e in hook.entries((DOCS / p).read_text("utf-8"))]
    assert len(rows) == len(entries)
    for name in set(prunekit.__all__) - {"__version__"}:
        found = getattr(prunekit, name)
        own = getattr(found, "__name__", name) == name  # PruningBase: the class's own doc
        first = " ".join((found.__doc__ or "").split())[:30] if own else ""
        assert any(row.startswith(f"| [`{name}`]") and first in row for row in rows), name
    assert any(
        row.startswith("| [`report`](model.md#prunekit.report.report) | function") for row in rows
    )
    assert any(
        row.startswith("| [`export.export`](export.md#prunekit.export.export)") for row in rows
    )


def test_expected_output_reads_loops() -> None:
    code = "for x in (1, 2):\n    print(x)\n# 1\n# 2\nprint(3)  # 3\n# not output\n"
    assert expected_output(code) == ["1", "2", "3"]


def test_blocks_of_reads_indented_and_marked_fences(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "- item\n\n    ```python\n    x = 1\n    ```\n\n<!-- not run: needs a GPU -->\n"
        "```py\ny = 2\n```\n\n````text\n```python\nno\n```\n````\n",
        encoding="utf-8",
    )
    blocks = blocks_of(page)
    assert [(block.code, block.not_run) for block in blocks] == [
        ("x = 1\n", None),
        ("y = 2\n", "needs a GPU"),
    ]
    ast.parse(blocks[0].code)
