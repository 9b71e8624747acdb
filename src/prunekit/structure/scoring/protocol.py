"""What a group criterion is: ``GroupCriterion``, the ``Calibration`` it is prepared on, and
the sums over a unit's entries that every criterion scores through.

A criterion that learns from data says so (``calibrated``) and gathers its statistics in
``gather(calibration)``; ``prepare``, the one entry the score stage calls, is written here
once for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.structure.graph.graph import ChannelGroup, Slice

Loss = Callable[[Any, Any], Tensor]


@dataclass(frozen=True)
class Calibration:
    """What a criterion is prepared on: the model, the groups it will score, the checked
    calibration batches (None: none given) and the loss of the model's output and a batch.

    Attributes:
        model: the model (a criterion leaves it as it was).
        groups: the groups ``scores`` will be asked for.
        batches: the calibration batches, or None.
        loss: ``loss(output, batch)``, or None (``output.loss``).
    """

    model: nn.Module
    groups: Sequence[ChannelGroup]
    batches: list[Any] | None
    loss: Loss | None

    def required(self) -> list[Any]:
        """The batches of a criterion that cannot do without them (``calibrated = True``:
        the score stage refuses a call without them before preparing)."""
        assert self.batches is not None, "a calibrated criterion is prepared on batches"
        return self.batches


class GroupCriterion:
    """Ranks the units of channel groups: ``scores(group)`` gives one score per unit (higher:
    more important, kept longer).

    A criterion that learns from data sets ``calibrated = True``: ``prune_channels`` then
    calls ``prepare(model, groups, batches, loss)`` once, before any score, with the
    calibration batches it was given (``calibrated = None``: they are optional), and
    ``prepare`` hands them to ``gather`` as one ``Calibration``. Either must leave the model
    as it was.

    Attributes:
        calibrated: True (needs calibration batches), None (takes them) or False (takes
            none).
        uses_loss: whether `loss` (of the model's output and the batch) means anything.
    """

    calibrated: bool | None = False
    uses_loss = False

    def prepare(
        self,
        model: nn.Module,
        groups: Sequence[ChannelGroup],
        batches: list[Any] | None,
        loss: Loss | None,
    ) -> None:
        """Gather what the scores need, once before any score.

        Args:
            model: the model.
            groups: the groups that will be scored.
            batches: the calibration batches, or None.
            loss: the loss of the output and a batch, or None.
        """
        self.gather(Calibration(model, groups, batches, loss))

    def gather(self, calibration: Calibration) -> None:
        """Gather what the scores need from `calibration` (nothing, for a criterion of the
        weights alone).

        Args:
            calibration: the model, groups, batches and loss.
        """

    def scores(self, group: ChannelGroup) -> Tensor:
        """One score per unit of `group`.

        Args:
            group: one of the groups prepared for.

        Returns:
            A tensor of shape ``(group.size,)``.

        Raises:
            NotImplementedError: the subclass defines no scores.
        """
        raise NotImplementedError(f"{type(self).__name__} defines no scores(group)")

    def __call__(self, group: ChannelGroup) -> Tensor:
        return self.scores(group)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def parameter_slices(group: ChannelGroup) -> list[Slice]:
    """The slices of `group` that are parameters (not buffers)."""
    return [s for s in group.slices if not s.is_buffer]


def consumer_modules(groups: Sequence[ChannelGroup]) -> list[nn.Module]:
    """The modules that read the groups' units (their slices of role 'in'), each once, in
    the order the groups name them."""
    return list(
        {id(s.module): s.module for g in groups for s in g.slices if s.role == "in"}.values()
    )


def values(s: Slice) -> Tensor:
    """The slice's tensor as the model computes with it (masked where pruned), float64."""
    value: Tensor = getattr(s.module, s.name)
    return value.detach().to(torch.float64)


def unit_sums(group: ChannelGroup, slices: list[Slice], entry: Callable[[Slice], Tensor]) -> Tensor:
    """Sum of `entry` over the positions each unit owns, over all slices."""
    total = torch.zeros(group.size, dtype=torch.float64)
    for s in slices:
        total += per_unit(s, entry(s), group.size)
    return total


def per_unit(s: Slice, entries: Tensor, size: int) -> Tensor:
    """`entries` (shaped like the slice's tensor) summed over the positions of each unit."""
    moved = entries.movedim(s.dim, 0)
    per_position = moved.reshape(moved.shape[0], -1).sum(1)
    units = [u for u, positions in enumerate(s.indices) for _ in positions]
    flat = [p for positions in s.indices for p in positions]
    total = torch.zeros(size, dtype=torch.float64)
    return total.index_add_(0, torch.tensor(units, dtype=torch.long), per_position[flat])
