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


class Shifted(nn.Module):
    """A model given its input and a shift inside a tuple of tuples (as a key/value cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor, shift: tuple[tuple[torch.Tensor]]) -> torch.Tensor:
        out: torch.Tensor = self.linear(x + shift[0][0])
        return out


def test_a_value_not_finite_deep_in_a_batch_is_named() -> None:
    """recover looked one level into a batch for NaN and inf, calibration's checks three: a
    NaN in a keyword's tuple of tuples (a cache's shape) made recover blame no batch."""
    torch.manual_seed(0)
    teacher = Shifted().eval()
    student = copy.deepcopy(teacher)
    prunekit.l1_unstructured(student.linear, "weight", amount=0.5)
    shift = torch.zeros(8, 6)
    shift[2, 5] = math.nan
    found = [{"x": torch.randn(8, 6), "shift": ((shift,),)}]
    refused(
        lambda: prunekit.recover(student, prunekit.Distiller(teacher), found, steps=2, lr=1e-3),
        ValueError,
        r"^recover: the loss of step 0 is nan; expected a finite loss \(batch 0 holds nan at "
        r"index \(2, 5\) of shift\[0\]\[0\]: batches on which both models",
        model=student,
    )
