"""Shared fixtures: seeded RNGs for every test; `framework` runs a test on both frameworks;
`one_pass` records whether each call of the selection's one pass held."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from frameworks import FRAMEWORK_NAMES, Framework
from prunekit import select


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
def one_pass(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """True or False per call of select._mark_between: whether the one pass held."""
    held: list[bool] = []
    real = select._mark_between

    def spy(*args):  # type: ignore[no-untyped-def]
        result = real(*args)
        held.append(result is not None)
        return result

    monkeypatch.setattr(select, "_mark_between", spy)
    return held
