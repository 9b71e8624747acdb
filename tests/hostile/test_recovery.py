"""Hostile calls of prunekit.recover: a run that cannot go on names its cause and leaves the
student bit for bit as it was."""

from __future__ import annotations

import copy
import math
from typing import Any

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


def refuses_a_nan_loss(
    teacher: nn.Module, student: nn.Module, found: list[Any], steps: int, step: int, said: str
) -> None:
    """``recover`` of `student` towards `teacher` on `found` over `steps` is refused at `step`,
    its loss NaN, the error going on with `said` (a regex); `student` is left as it was."""
    refused(
        lambda: prunekit.recover(student, prunekit.Distiller(teacher), found, steps=steps,
                                 lr=1e-3),
        ValueError,
        rf"^recover: the loss of step {step} is nan; expected {said}",
        model=student,
    )  # fmt: skip


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("index", [0, 2])
def test_a_batch_holding_values_that_are_not_finite_is_named_not_the_lr(
    bad: float, index: int
) -> None:
    teacher, student = pair()
    found = batches()
    found[index] = found[index].clone()
    found[index][3, 1] = bad
    refuses_a_nan_loss(teacher, student, found, 8, index, rf".*batch {index} holds {bad}.*finite")


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
    said = (r"a finite loss \(batch 0 holds nan at index \(2, 5\) of shift\[0\]\[0\]: batches "
            r"on which both models")  # fmt: skip
    refuses_a_nan_loss(teacher, student, found, 2, 0, said)
