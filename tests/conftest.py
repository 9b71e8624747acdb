"""Shared fixtures: seeded RNGs for every test; `framework` runs a test on both frameworks."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from frameworks import FRAMEWORK_NAMES, Framework


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
