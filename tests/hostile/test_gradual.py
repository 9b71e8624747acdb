"""Hostile states for GradualPruner.load_state_dict: a mask that is no mask is named and
nothing changes (it was read as 'kept' wherever it was not 0)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

import prunekit
from helpers.gradual_models import Small, train_step
from hostile.support import refused


def setup(seed: int = 0) -> tuple[Any, Any, Any]:
    torch.manual_seed(seed)
    model = Small()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    pruner = prunekit.GradualPruner(model, 0.9, start_step=2, end_step=11, every=3)
    return model, optimizer, pruner


def saved() -> dict[str, Any]:
    model, optimizer, pruner = setup()
    for step in range(1, 6):
        train_step(model, optimizer, step)
        pruner.step()
    return pruner.state_dict()


@pytest.mark.parametrize("value", [0.5, math.nan, 2.0, -1.0], ids=["half", "nan", "two", "minus"])
def test_a_mask_holding_other_values_than_0_and_1_is_refused(value: float) -> None:
    state = copy.deepcopy(saved())
    mask = state["masks"]["fc1.weight"].float()
    mask[0, 0] = value
    state["masks"]["fc1.weight"] = mask
    model, _, pruner = setup(seed=1)
    refused(
        lambda: pruner.load_state_dict(state),
        ValueError,
        rf"^GradualPruner\.load_state_dict: .*'fc1\.weight'.*{value}.*only 0 and 1",
        model=model,
    )
    assert pruner.steps == 0 and not prunekit.is_pruned(model)
