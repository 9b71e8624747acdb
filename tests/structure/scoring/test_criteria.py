"""The group criteria's one table and one prepare: every name makes a new criterion, a
criterion of one's own gathers from one Calibration (or still overrides prepare)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from prunekit.structure.graph.graph import ChannelGroup
from prunekit.structure.scoring.criteria import CRITERIA, TABLE, builtin
from prunekit.structure.scoring.protocol import Calibration, GroupCriterion


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))


def test_every_name_of_the_table_makes_a_new_criterion() -> None:
    assert tuple(TABLE) == CRITERIA
    assert CRITERIA[:3] == ("l1", "l2", "bn_scale")
    for name in CRITERIA:
        one, other = builtin(name), builtin(name)
        assert isinstance(one, GroupCriterion) and one is not other
        assert type(one) is type(other)
    assert repr(builtin("l1")) == "WeightNorm(p=1)"
    with pytest.raises(ValueError, match=r"unknown criterion='l3'; expected one of \['l1'"):
        builtin("l3")


class Recorded(GroupCriterion):
    """Scores each unit by its index, after recording what it was prepared on."""

    calibrated = True
    uses_loss = True

    def __init__(self) -> None:
        self.seen: list[Calibration] = []

    def gather(self, calibration: Calibration) -> None:
        self.seen.append(calibration)

    def scores(self, group: ChannelGroup) -> Tensor:
        return torch.arange(group.size, dtype=torch.float64)


def test_a_criterion_of_ones_own_gathers_from_one_calibration() -> None:
    model, batches = mlp(), [torch.randn(4, 6), torch.randn(2, 6)]

    def loss(output: Any, batch: Any) -> Tensor:
        return output.sum()

    criterion = Recorded()
    found = prunekit.prune_channels(model, batches[0], 0.5, criterion=criterion,
                                    calibration=batches, loss=loss)  # fmt: skip
    (seen,) = criterion.seen
    assert seen.model is model and seen.loss is loss
    assert seen.batches == batches and seen.required() == batches
    assert [g.name for g in seen.groups] == [p.group.name for p in found]
    assert found[0].units == tuple(range(6))  # the lowest scores: the first indices


def test_a_criterion_that_overrides_prepare_still_is_prepared() -> None:
    calls: list[tuple[nn.Module, int, int]] = []

    class Old(GroupCriterion):
        calibrated = True

        def prepare(self, model: nn.Module, groups: Any, batches: Any, loss: Any) -> None:
            calls.append((model, len(groups), len(batches)))

        def scores(self, group: ChannelGroup) -> Tensor:
            return -torch.arange(group.size, dtype=torch.float64)

    model, batches = mlp(), [torch.randn(4, 6)]
    found = prunekit.prune_channels(model, batches[0], 0.5, criterion=Old(), calibration=batches)
    assert calls == [(model, 1, 1)]
    assert found[0].units == tuple(range(6, 12))
