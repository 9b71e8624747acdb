"""Hostile arguments for prune_model (prunekit.whole): what is selected is what the
arguments name, and the report tells what the model holds."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
import torch
from torch import nn

import prunekit


def small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))


def masked(model: nn.Module) -> list[str]:
    return [row.name for row in prunekit.report(model).rows if row.masked]


ONCE: dict[str, Callable[[list[str]], Iterable[str]]] = {
    "generator": lambda names: (name for name in names),
    "iterator": iter,
    "map": lambda names: map(str, names),
}


@pytest.mark.parametrize("kind", list(ONCE))
@pytest.mark.parametrize("method", ["l1", "wanda"])
def test_globs_given_as_an_iterator_select_what_they_name(kind: str, method: str) -> None:
    """An include or exclude that can be read once (a generator) selects as its list does:
    it was read empty after its check, so include pruned every weight and exclude none."""
    calibration = None if method == "l1" else [torch.randn(4, 8)]
    model = small()
    prunekit.prune_model(
        model, 0.5, method=method, calibration=calibration, include=ONCE[kind](["0.weight"])
    )
    assert masked(model) == ["0.weight"]
    model = small()
    prunekit.prune_model(
        model, 0.5, method=method, calibration=calibration, exclude=ONCE[kind](["0"])
    )
    assert masked(model) == ["2.weight"]
