"""Shared fixtures: seeded RNGs for every test; `framework` runs a test on both frameworks;
`one_pass` records whether each call of the selection's one pass held."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
import torch

from frameworks import FRAMEWORK_NAMES, Framework
from prunekit.select import trace


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
