"""The hostile suite of the ship entry points: fixtures (tiny folders and text, never
written to), and the tally printed at the end of a run: cases run, held, and broke before
their fixes, by entry point (``catalog``)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import tiny_llm
from hostile.catalog import ENTRY_POINTS, broke, entry_point

# --- tiny models and folders -----------------------------------------------------------------


@pytest.fixture(scope="session")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama folder (one weights file) with its tokenizer; never written to."""
    return tiny_llm.save_folder(tmp_path_factory.mktemp("hostile-src") / "model")


@pytest.fixture(scope="session")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama in shards of about 20 kB, with its tokenizer; never written to."""
    return tiny_llm.save_folder(tmp_path_factory.mktemp("hostile-shards") / "model", sharded=True)


@pytest.fixture(scope="session")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llm.text_file(tmp_path_factory.mktemp("hostile-text") / "text.txt")


@pytest.fixture
def copy_of(tmp_path: Path) -> Callable[[Path], Path]:
    """A copy of a session folder in this test's own place (to damage)."""

    def make(source: Path) -> Path:
        target = tmp_path / f"copy-{source.name}"
        shutil.copytree(source, target)
        return target

    return make


# --- the tally --------------------------------------------------------------------------------

_TALLY: dict[str, dict[str, int]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "tests/hostile/" not in report.nodeid.replace("\\", "/"):
        return
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    row = _TALLY.setdefault(entry_point(report.nodeid), {"run": 0, "held": 0, "broke": 0})
    row["run"] += 1
    row["held"] += report.outcome == "passed"
    row["broke"] += broke(report.nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _TALLY:
        return
    write = terminalreporter.write_line
    write("hostile suite: cases run / held now / broke before their fixes, by entry point")
    total = {"run": 0, "held": 0, "broke": 0}
    for name in [*ENTRY_POINTS.values(), *sorted(set(_TALLY) - set(ENTRY_POINTS.values()))]:
        row = _TALLY.get(name)
        if row is None:
            continue
        write(f"  {name:<28} {row['run']:>4} run {row['held']:>4} held {row['broke']:>4} broke")
        for key in total:
            total[key] += row[key]
    write(f"  {'all':<28} {total['run']:>4} run {total['held']:>4} held {total['broke']:>4} broke")


@pytest.fixture(autouse=True)
def _no_grad_leak() -> Iterator[None]:
    grad = torch.is_grad_enabled()
    yield
    assert torch.is_grad_enabled() == grad
