"""The API reference's index, made from the docstrings when the site is built (mkdocs.yml: hooks).

docs/reference/index.md holds the line ``<!-- reference table -->``; the build replaces it
with one table per page of docs/reference/ (in the order of the site's navigation): every
entry a ``::: prunekit.NAME`` line of that page documents, linked to it, with its kind and
the first paragraph of its docstring. Nothing in the table is written by hand, so it cannot
say something else than the entries themselves. The source is read as the reference reads
it (griffe, without importing prunekit).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import griffe

MARKER = "<!-- reference table -->"
INDEX = "reference/index.md"
DIRECTIVE = re.compile(r"^::: (prunekit(?:\.\w+)+)\s*$", re.M)


@cache
def _package(src: Path) -> griffe.Module:
    loaded = griffe.load("prunekit", search_paths=[str(src)], docstring_parser="google")
    assert isinstance(loaded, griffe.Module)
    return loaded


def _target(package: griffe.Module, dotted: str) -> griffe.Object:
    found: griffe.Object | griffe.Alias = package[dotted.removeprefix("prunekit.")]
    if isinstance(found, griffe.Alias):
        found = found.final_target
    assert isinstance(found, griffe.Object)
    return found


def shown_name(package: griffe.Module, dotted: str) -> str:
    """How the table names an entry: as ``prunekit`` exports it where it does (``report`` for
    ``prunekit.report.report``), else by its path below ``prunekit``."""
    last = dotted.rpartition(".")[2]
    exported = last in (package.exports or ())
    if exported and _target(package, dotted).parent is package.members.get(last):
        return last  # a module and its function of the same name: prunekit.report.report
    return dotted.removeprefix("prunekit.")


def summary(obj: griffe.Object) -> str:
    """The first paragraph of the docstring, on one line, ready for a table cell."""
    text = obj.docstring.value if obj.docstring is not None else ""
    first = " ".join(text.strip().split("\n\n", 1)[0].split())
    # a pipe ends a cell unless escaped; in a code span the escape would show, and the
    # table's parser leaves pipes there alone
    parts = re.split(r"(`+[^`]*`+)", first)
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def _kind(obj: griffe.Object) -> str:
    if isinstance(obj, griffe.Attribute):  # PruningBase = BasePruningMethod: another name
        return f"alias of `{obj.value}`" if isinstance(obj.value, griffe.ExprName) else "constant"
    return obj.kind.value


def entries(page_text: str) -> list[str]:
    """The dotted names a reference page documents, in its order."""
    return DIRECTIVE.findall(page_text)


def table(src: Path, page: Path, link: str) -> Iterator[str]:
    """The lines of one page's table; `link`: the page's address from the index."""
    package = _package(src)
    yield "| name | kind | what it is |"
    yield "| --- | --- | --- |"
    for dotted in entries(page.read_text(encoding="utf-8")):
        obj = _target(package, dotted)
        name = shown_name(package, dotted)
        yield f"| [`{name}`]({link}#{dotted}) | {_kind(obj)} | {summary(obj)} |"


def title(page: Path) -> str:
    """A page's first ``# `` heading."""
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return page.stem


def reference_pages(nav: Any) -> list[str]:
    """The pages under reference/ in the navigation's order, the index aside."""
    found: list[str] = []

    def walk(item: Any) -> None:
        if isinstance(item, str):
            if item.startswith("reference/") and item != INDEX:
                found.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                walk(value)
        elif isinstance(item, list):
            for value in item:
                walk(value)

    walk(nav)
    return found


def index_tables(root: Path, docs: Path, nav: Any) -> str:
    """The markdown that replaces the marker: a heading and a table per reference page."""
    parts: list[str] = []
    for uri in reference_pages(nav):
        page = docs / uri
        link = uri.removeprefix("reference/")
        parts.append(f"## [{title(page)}]({link})\n")
        parts.append("\n".join(table(root / "src", page, link)) + "\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs's hook: fill the index's marker; every other page passes unchanged."""
    if page.file.src_uri != INDEX:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{INDEX}: the line {MARKER} is missing; the table goes there")
    root = Path(config["config_file_path"]).parent
    return markdown.replace(MARKER, index_tables(root, Path(config["docs_dir"]), config["nav"]))
