"""Shared fixtures: seeded RNGs for every test; `framework` runs a test on both frameworks;
`two_torch_threads` runs a test at two torch threads; `one_pass` records whether each call of
the selection's one pass held; `imported_by` tells which modules a fresh interpreter holds
after importing prunekit; `tiny_llama` gives the tiny sharded Llama folders that several
files read. Every test runs with the channel graph's skimmed trace strict: a failure of it
that is not a value read raises (a bug of ``trace.skim`` would else only slow the trace)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from helpers import tiny_llm
from helpers.frameworks import FRAMEWORK_NAMES, Framework
from prunekit.select import trace
from prunekit.structure.trace import tracer as graph_tracer

graph_tracer.STRICT_SKIM = True


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker takes its share of the cores for torch's threads (and
    so do the processes it starts, through OMP_NUM_THREADS): two workers of two threads each
    on two cores spend most of their time waiting for one another (a 3x3 convolution of a few
    kB took 25 ms against 0.2 ms on one thread). The tests of thread counts set their own."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 0:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


@pytest.fixture(autouse=True)
def _threads_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """torch's thread count after a test is the one before it: a test that leaves another
    one is named (a warning) and the count put back, so it cannot slow or change later tests."""
    before = torch.get_num_threads()
    yield
    after = torch.get_num_threads()
    if after != before:
        torch.set_num_threads(before)
        warnings.warn(f"{request.node.nodeid} left torch at {after} threads, not {before}",
                      stacklevel=1)  # fmt: skip


@pytest.fixture
def two_torch_threads() -> Iterator[None]:
    """torch at two threads for the test (so each chunk of a parallel loop runs in two
    parts), the count before put back after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
    if importlib.util.find_spec("tensorplay") is not None:
        import tensorplay

        tensorplay.manual_seed(0)


@pytest.fixture(params=FRAMEWORK_NAMES)
def framework(request: pytest.FixtureRequest) -> Framework:
    """Each framework in turn (tensorplay is skipped where it is not installed)."""
    return Framework(request.param)


@pytest.fixture
def one_pass() -> Iterator[list[bool]]:
    """True or False per try of the selection's one pass: whether it held."""
    held: list[bool] = []

    def listen(event: str) -> None:
        if event.startswith("one pass"):
            held.append(event == "one pass")

    with trace.recorded(listen):
        yield held


_IMPORTS = """
import json, sys
import prunekit
after_prunekit = sorted(sys.modules)
import prunekit.schedule
print(json.dumps({"prunekit": after_prunekit, "prunekit.schedule": sorted(sys.modules)}))
"""


@pytest.fixture(scope="session")
def imported_by() -> dict[str, frozenset[str]]:
    """The modules a fresh interpreter holds after `import prunekit` and then after
    `import prunekit.schedule`: one subprocess for every test that checks the import stays light."""
    out = subprocess.run(
        [sys.executable, "-c", _IMPORTS], capture_output=True, text=True, check=True
    )
    return {name: frozenset(mods) for name, mods in json.loads(out.stdout).items()}


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`tiny_llama(vocab=300, layers=2, tied=False)`: the folder of
    `helpers.tiny_llm.sharded_folder` for those arguments, written once per session and shared:
    never write into it (copy it first)."""
    made: dict[tuple[int, int, bool], Path] = {}

    def folder(vocab: int = 300, layers: int = 2, tied: bool = False) -> Path:
        key = (vocab, layers, tied)
        if key not in made:
            place = tmp_path_factory.mktemp(f"tiny-llama-{vocab}-{layers}-{int(tied)}")
            made[key] = tiny_llm.sharded_folder(place / "model", vocab, layers, tied)
        return made[key]

    return folder


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A new empty folder made the working folder (where an empty path would write)."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    return here
