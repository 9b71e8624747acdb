"""Shared fixtures: `framework` runs a test once on torch and once on tensorplay."""

from __future__ import annotations

import pytest

from frameworks import FRAMEWORK_NAMES, Framework


@pytest.fixture(params=FRAMEWORK_NAMES)
def framework(request: pytest.FixtureRequest) -> Framework:
    """Each framework in turn (tensorplay is skipped where it is not installed)."""
    return Framework(request.param)
