"""Hostile calls of prunekit.recover: a run that cannot go on names its cause and leaves the
student bit for bit as it was."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import prunekit
from hostile.support import refused


def pair() -> tuple[nn.Module, nn.Module]:
    """The dense teacher and a pruned copy of it."""
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    student = copy.deepcopy(teacher)
    prunekit.prune_channels(student, torch.randn(8, 6), 0.5)
    return teacher, student


def batches(count: int = 4) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(8, 6, generator=generator) for _ in range(count)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("index", [0, 2])
def test_a_batch_holding_values_that_are_not_finite_is_named_not_the_lr(
    bad: float, index: int
) -> None:
    teacher, student = pair()
    found = batches()
    found[index] = found[index].clone()
    found[index][3, 1] = bad
    refused(
        lambda: prunekit.recover(student, prunekit.Distiller(teacher), found, steps=8, lr=1e-3),
        ValueError,
        rf"^recover: the loss of step {index} is nan; expected .*batch {index} holds "
        rf"{bad}.*finite",
        model=student,
    )


def test_a_loss_gone_nan_on_finite_batches_still_blames_the_lr() -> None:
    teacher, student = pair()
    found = batches(2)
    with pytest.raises(ValueError, match=r"step \d+ is (nan|inf).*a smaller lr"):
        prunekit.recover(student, prunekit.Distiller(teacher), found, steps=60, lr=1e30)
