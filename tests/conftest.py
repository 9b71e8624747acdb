"""Shared fixtures: seeded RNGs for every test; `framework` runs a test on both frameworks;
`one_pass` records whether each call of the selection's one pass held; `imported_by` tells which
modules a fresh interpreter holds after importing prunekit. Every test runs with the channel
graph's skimmed trace strict: a failure of it that is not a value read raises (a bug of
``trace.skim`` would else only slow the trace)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from helpers.frameworks import FRAMEWORK_NAMES, Framework
from prunekit.select import trace
from prunekit.structure.trace import tracer as graph_tracer

graph_tracer.STRICT_SKIM = True


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
