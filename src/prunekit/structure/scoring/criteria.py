"""The group criteria by name (``TABLE``, filled here and nowhere else), and the scoring of
groups every caller goes through: the criterion resolved, its batches and loss checked, it
prepared once and its scores checked.

Built in, by name: 'l1' and 'l2' (norm of every parameter entry the unit owns), 'bn_scale'
(|gamma| of the group's norm layers; a group without one falls back to 'l2'; these three in
``prunekit.structure.scoring.weights``), 'taylor'
(|sum of w x grad| over the unit's entries: the first-order change of the loss when the unit
is removed; from the gradients already in ``.grad``, or from calibration batches),
'activation' (Wanda-style: |W| x the input norm of every consumer column that reads the unit,
from calibration batches; see ``prunekit.structure.scoring.data_criteria``), 'obs' (the structured
optimal-brain-surgeon error that removing the unit leaves in its consumers, from their
input Hessians) and 'fluctuation' (FLAP: input-channel variance x squared weight-column
norm; both in ``prunekit.structure.scoring.consequence``); for routed experts, 'frequency' and
'reap' (``prunekit.structure.scoring.expert_criteria``). A ``GroupCriterion`` or a
plain callable ``criterion(group) -> Tensor`` of one score per unit is used as given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.calibrate import batch_list
from prunekit.core.checks import check_kind
from prunekit.structure.graph.graph import ChannelGroup
from prunekit.structure.scoring.consequence import OBS, Fluctuation
from prunekit.structure.scoring.data_criteria import Activation, GroupTaylor
from prunekit.structure.scoring.expert_criteria import ExpertSaliency, RoutingFrequency
from prunekit.structure.scoring.protocol import (
    Calibration,
    GroupCriterion,
    Loss,
    consumer_modules,
    parameter_slices,
    per_unit,
    unit_sums,
    values,
)
from prunekit.structure.scoring.weights import BNScale, WeightNorm

__all__ = [
    "CRITERIA",
    "ROUNDING",
    "TABLE",
    "BNScale",
    "Calibration",
    "GroupCriterion",
    "Loss",
    "WeightNorm",
    "builtin",
    "checked",
    "consumer_modules",
    "criterion_batches",
    "group_criterion",
    "group_scores",
    "nonnegative",
    "parameter_slices",
    "per_unit",
    "rank",
    "score_groups",
    "unit_sums",
    "values",
]

TABLE: dict[str, Callable[[], GroupCriterion]] = {
    "l1": partial(WeightNorm, 1),
    "l2": partial(WeightNorm, 2),
    "bn_scale": BNScale,
    "taylor": GroupTaylor,
    "activation": Activation,
    "obs": OBS,
    "fluctuation": Fluctuation,
    "frequency": RoutingFrequency,
    "reap": ExpertSaliency,
}
"""The built-in group criteria by name, each a maker of a new instance: the one place they
are listed."""

CRITERIA = tuple(TABLE)
"""The names of the built-in group criteria."""


def builtin(name: str) -> GroupCriterion:
    """A new instance of the built-in criterion `name`.

    Raises:
        ValueError: no built-in criterion has that name.
    """
    make = TABLE.get(name)
    if make is None:
        raise ValueError(
            f"prune_channels: unknown criterion={name!r}; expected one of {list(CRITERIA)}, a "
            "GroupCriterion or a callable(group) -> Tensor of one score per unit"
        )
    return make()


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


def checked(
    group: ChannelGroup, criterion: Any, scores: Any, compared: str | None = None
) -> Tensor:
    """`scores` as float64 on the CPU, after checking its shape and values; with `compared`
    (what compares them across groups: 'a budget', "scope='global'"), none below 0 (those of
    rounding made 0, see ``nonnegative``)."""
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
    return result if compared is None else nonnegative(group, criterion, result, compared)


ROUNDING = 1e-9
"""A score below 0 by at most this share of its group's largest |score| is 0 (rounding: a
quadratic form such as 'obs' computes may come out at -1e-12 of its group's scale)."""


def nonnegative(group: ChannelGroup, criterion: Any, scores: Tensor, compared: str) -> Tensor:
    """`scores` with those below 0 by rounding alone (``ROUNDING``) made 0.

    Scores compared across groups are divided by their group's mean first: a negative
    group mean would leave them undivided, and one near 0 make them huge, so that group's
    units would go first, however its scores are spread.

    Args:
        group: the group scored.
        criterion: the criterion that scored it (named by the error).
        scores: its float64 scores.
        compared: what compares them across groups ('a budget', "scope='global'").

    Returns:
        The scores, none below 0.

    Raises:
        ValueError: a score is below 0 by more than rounding (the lowest named).
    """
    negative = scores < 0
    if not bool(negative.any()):
        return scores
    rounding = negative & (scores >= -ROUNDING * float(scores.abs().max()))
    found = torch.where(rounding, 0.0, scores)
    lowest = int(found.argmin())
    if found[lowest] < 0:
        raise ValueError(
            f"prune_channels: criterion {criterion!r} gave a negative score for group "
            f"{group.name}: {float(found[lowest]):.6g} (unit {lowest}); expected scores >= 0 "
            f"with {compared}, which divides each unit's score by its group's mean to "
            f"compare groups (a negative or near-zero mean would skew what each group "
            f"loses); a score above -{ROUNDING:g} x its group's largest |score| counts as 0"
        )
    return found


def score_groups(
    model: nn.Module,
    groups: Sequence[ChannelGroup],
    criterion: Any,
    calibration: Any = None,
    loss: Loss | None = None,
) -> list[Tensor]:
    """The scores of each of `groups`, the criterion prepared on `calibration` first."""
    found = group_criterion(criterion)
    batches = criterion_batches(found, criterion, calibration, loss)
    return rank(model, groups, found, batches, loss)


def criterion_batches(
    found: GroupCriterion | Callable[[ChannelGroup], Tensor],
    criterion: Any,
    calibration: Any,
    loss: Loss | None,
) -> list[Any] | None:
    """The calibration batches the criterion `found` (resolved from `criterion`) is
    prepared on: checked against what it takes, with `loss`.

    Raises:
        ValueError: `loss` for a criterion that uses none, or without batches; batches
            for a criterion that uses none, or none for one that needs them.
        TypeError: `calibration` is no iterable of batches.
    """
    wants = found.calibrated if isinstance(found, GroupCriterion) else False
    if loss is not None and not getattr(found, "uses_loss", False):
        raise ValueError(
            f"prune_channels: loss is for criterion='taylor' (from calibration batches); got "
            f"criterion={criterion!r}"
        )
    return _batches(found, wants, calibration, loss)


def rank(
    model: nn.Module,
    groups: Sequence[ChannelGroup],
    found: GroupCriterion | Callable[[ChannelGroup], Tensor],
    batches: list[Any] | None,
    loss: Loss | None,
    compared: str | None = None,
) -> list[Tensor]:
    """The checked scores of each of `groups` by `found`, prepared on `batches` first (as
    ``criterion_batches`` gave them); with `compared` (what compares them across groups),
    none below 0 (``nonnegative``)."""
    if isinstance(found, GroupCriterion):
        found.prepare(model, groups, batches, loss)
    return [checked(g, found, found(g), compared) for g in groups]


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
