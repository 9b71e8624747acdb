"""Importance of each unit of a channel group, aggregated over all of the group's slices.

Built in, by name: 'l1' and 'l2' (norm of every parameter entry the unit owns), 'bn_scale'
(|gamma| of the group's norm layers; a group without one falls back to 'l2'), 'taylor'
(|sum of w x grad| over the unit's entries: the first-order change of the loss when the unit
is removed; from the gradients already in ``.grad``, or from calibration batches),
'activation' (Wanda-style: |W| x the input norm of every consumer column that reads the unit,
from calibration batches; see ``prunekit.structure.scoring.calibrated``), 'obs' (the structured
optimal-brain-surgeon error that removing the unit leaves in its consumers, from their
input Hessians) and 'fluctuation' (FLAP: input-channel variance x squared weight-column
norm; both in ``prunekit.structure.scoring.consequence``); for routed experts, 'frequency' and
'reap' (``prunekit.structure.scoring.expert_criteria``). A ``GroupCriterion`` or a
plain callable ``criterion(group) -> Tensor`` of one score per unit is used as given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.checks import check_kind
from prunekit.criteria.calibration import batch_list
from prunekit.structure.graph.graph import ChannelGroup, Slice

CRITERIA = (
    "l1",
    "l2",
    "bn_scale",
    "taylor",
    "activation",
    "obs",
    "fluctuation",
    "frequency",
    "reap",
)
Loss = Callable[[Any, Any], Tensor]


class GroupCriterion:
    """Ranks the units of channel groups: ``scores(group)`` gives one score per unit (higher:
    more important, kept longer).

    A criterion that learns from data sets ``calibrated = True``: ``prune_channels`` then
    calls ``prepare(model, groups, batches, loss)`` once, before any score, with the
    calibration batches it was given (``calibrated = None``: they are optional). ``prepare``
    must leave the model as it was.

    Attributes:
        calibrated: True when the criterion needs calibration batches, None when they are
            optional, False (the default) when it scores the weights alone.
        uses_loss: whether the `loss` ``prune_channels`` passes to ``prepare`` means anything
            to it (a gradient-based criterion); False by default.
    """

    calibrated: bool | None = False
    uses_loss = False  # whether `loss` (of the model's output and the batch) means anything

    def prepare(
        self,
        model: nn.Module,
        groups: Sequence[ChannelGroup],
        batches: list[Any] | None,
        loss: Loss | None,
    ) -> None:
        """Gather what the scores need (nothing, for a criterion of the weights alone).

        Args:
            model: the model being pruned; it must be left as it was.
            groups: the groups that will be scored.
            batches: the calibration batches, or None where none were given.
            loss: ``loss(output, batch)`` for criteria of gradients (``uses_loss``), or None.
        """

    def scores(self, group: ChannelGroup) -> Tensor:
        """One score per unit of `group`; every subclass writes it.

        Args:
            group: a channel group of the model ``prepare`` saw.

        Returns:
            A 1-D tensor of ``group.size`` scores, higher for units kept longer.

        Raises:
            NotImplementedError: the subclass defines no ``scores``.
        """
        raise NotImplementedError(f"{type(self).__name__} defines no scores(group)")

    def __call__(self, group: ChannelGroup) -> Tensor:
        return self.scores(group)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class WeightNorm(GroupCriterion):
    """'l1' (p=1: sum of |w|) or 'l2' (p=2: root of the sum of w^2) over each unit's entries."""

    def __init__(self, p: int = 2) -> None:
        if p not in (1, 2):
            raise ValueError(f"WeightNorm: invalid p={p!r}; expected 1 or 2")
        self.p = p

    def scores(self, group: ChannelGroup) -> Tensor:
        params = parameter_slices(group)
        if self.p == 1:
            return unit_sums(group, params, lambda s: values(s).abs())
        return unit_sums(group, params, lambda s: values(s).square()).sqrt()

    def __repr__(self) -> str:
        return f"WeightNorm(p={self.p})"


class BNScale(GroupCriterion):
    """|gamma| of the group's norm layers, summed; 'l2' for a group without one."""

    def scores(self, group: ChannelGroup) -> Tensor:
        norms = [s for s in parameter_slices(group) if s.role == "norm" and s.name == "weight"]
        if norms:
            return unit_sums(group, norms, lambda s: values(s).abs())
        return WeightNorm(2).scores(group)


def builtin(name: str) -> GroupCriterion:
    """A new instance of the built-in criterion `name`."""
    if name == "l1":
        return WeightNorm(1)
    if name == "l2":
        return WeightNorm(2)
    if name == "bn_scale":
        return BNScale()
    if name in ("taylor", "activation"):
        # A cycle, as for the two below: these criteria are GroupCriterion subclasses.
        from prunekit.structure.scoring.calibrated import Activation, GroupTaylor  # noqa: PLC0415

        return GroupTaylor() if name == "taylor" else Activation()
    if name in ("frequency", "reap"):
        from prunekit.structure.scoring.expert_criteria import ExpertSaliency, RoutingFrequency  # noqa: PLC0415

        return RoutingFrequency() if name == "frequency" else ExpertSaliency()
    if name in ("obs", "fluctuation"):
        from prunekit.structure.scoring.consequence import OBS, Fluctuation  # noqa: PLC0415

        return OBS() if name == "obs" else Fluctuation()
    raise ValueError(
        f"prune_channels: unknown criterion={name!r}; expected one of {list(CRITERIA)}, a "
        "GroupCriterion or a callable(group) -> Tensor of one score per unit"
    )


def group_criterion(criterion: Any) -> GroupCriterion | Callable[[ChannelGroup], Tensor]:
    """The criterion object for a name, or the object given."""
    if isinstance(criterion, str):
        return builtin(criterion)
    if isinstance(criterion, GroupCriterion) or callable(criterion):
        return criterion  # type: ignore[no-any-return]
    raise TypeError(
        f"prune_channels: invalid criterion={criterion!r}; expected one of {list(CRITERIA)}, "
        "a GroupCriterion or a callable(group) -> Tensor of one score per unit"
    )


def group_scores(
    group: ChannelGroup, criterion: str | GroupCriterion | Callable[[ChannelGroup], Tensor]
) -> Tensor:
    """One float64 score per unit of `group` (higher: more important).

    A criterion that needs calibration data ('activation', or 'taylor' from batches) must
    be prepared first: ``prune_channels(..., calibration=...)`` does it.
    """
    found = group_criterion(criterion)
    if isinstance(found, GroupCriterion) and found.calibrated is True:
        raise ValueError(
            f"prune_channels: criterion {found!r} needs calibration data; expected "
            "prune_channels(..., criterion=..., calibration=[batches...])"
        )
    return checked(group, found, found(group))


def checked(group: ChannelGroup, criterion: Any, scores: Any) -> Tensor:
    """`scores` as float64 on the CPU, after checking its shape and values."""
    if not isinstance(scores, Tensor) or tuple(scores.shape) != (group.size,):
        found = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(
            f"prune_channels: criterion {criterion!r} returned {found} for group "
            f"{group.name}; expected a tensor of shape ({group.size},), one score per unit"
        )
    check_kind(
        scores,
        f"prune_channels: criterion {criterion!r}",
        f"the tensor of scores for group {group.name}",
    )
    result: Tensor = scores.detach().to(torch.float64).cpu()
    if not bool(torch.isfinite(result).all()):
        raise ValueError(
            f"prune_channels: criterion {criterion!r} gave non-finite scores for group "
            f"{group.name}; expected finite numbers"
        )
    return result


def parameter_slices(group: ChannelGroup) -> list[Slice]:
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


def score_groups(
    model: nn.Module,
    groups: Sequence[ChannelGroup],
    criterion: Any,
    calibration: Any = None,
    loss: Loss | None = None,
) -> list[Tensor]:
    """The scores of each of `groups`, the criterion prepared on `calibration` first."""
    found = group_criterion(criterion)
    wants = found.calibrated if isinstance(found, GroupCriterion) else False
    if loss is not None and not getattr(found, "uses_loss", False):
        raise ValueError(
            f"prune_channels: loss is for criterion='taylor' (from calibration batches); got "
            f"criterion={criterion!r}"
        )
    batches = _batches(found, wants, calibration, loss)
    if isinstance(found, GroupCriterion):
        found.prepare(model, groups, batches, loss)
    return [checked(g, found, found(g)) for g in groups]


def _batches(criterion: Any, wants: bool | None, calibration: Any, loss: Any) -> list[Any] | None:
    if calibration is None:
        if wants is True:
            raise ValueError(
                f"prune_channels: criterion {criterion!r} needs calibration data; expected "
                "calibration= an iterable of batches the model's forward takes"
            )
        if loss is not None:
            raise ValueError(
                "prune_channels: loss is used with calibration batches; expected calibration="
            )
        return None
    if wants is False:
        raise ValueError(
            f"prune_channels: criterion {criterion!r} uses no calibration data; expected "
            "calibration=None (criteria that use it: 'activation', 'taylor', 'obs', "
            "'fluctuation', 'frequency', 'reap'; or compensate=True)"
        )
    return batch_list(calibration, "prune_channels")
