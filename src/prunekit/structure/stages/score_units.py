"""The score stage: one score per unit of every candidate group (higher: kept longer).

The criterion the config names is made afresh for each run and prepared on the calibration
batches the config checked for it (``prunekit.structure.scoring``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from prunekit.structure.graph.graph import ChannelGroup
from prunekit.structure.scoring.criteria import group_criterion, rank
from prunekit.structure.stages.channel_config import ChannelConfig
from prunekit.structure.stages.trace_groups import Traced


@dataclass(frozen=True)
class Scored:
    """What the score stage hands on: the candidate groups and their units' scores.

    Attributes:
        groups: the candidate groups, as traced.
        scores: per group, one float64 score per unit, on the CPU.
    """

    groups: list[ChannelGroup]
    scores: list[Tensor]


def score(model: nn.Module, traced: Traced, config: ChannelConfig) -> Scored:
    """The scores of the traced groups by `config.criterion`.

    Args:
        model: the model (a calibrated criterion runs it, and leaves it as it was).
        traced: the candidate groups.
        config: the checked options.

    Returns:
        The groups and their scores.

    Raises:
        ValueError: the criterion gave scores of the wrong shape or non-finite ones, or
            negative ones where a budget or scope='global' compares them across groups.
    """
    found = group_criterion(config.criterion)
    batches = None if config.scoring is None else list(config.scoring)
    compared = across_groups(config)
    scores = rank(model, traced.groups, found, batches, config.loss, compared)
    return Scored(traced.groups, scores)


def across_groups(config: ChannelConfig) -> str | None:
    """What compares the scores across groups, dividing each by its group's mean ('a
    budget', "scope='global'"); None where each group's are compared among themselves."""
    if config.budget is not None:
        return "a budget"
    return "scope='global'" if config.scope == "global" else None
