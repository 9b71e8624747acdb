"""The allocate stage: which units of the scored groups to mask.

One of three ways, as the config says: a share of each kind of group (``shares``: `amount`,
`heads`, `hidden`), the routed experts among them (with what their routers must keep), or
one budget for the whole model (``meet_budget``; a latency budget probes the model through
the install stage, and leaves it as it was).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from prunekit.structure.probe import latency_probe
from prunekit.structure.pruned import PrunedGroup
from prunekit.structure.stages.channel_config import ChannelConfig
from prunekit.structure.stages.install_masks import install
from prunekit.structure.stages.meet_budget import meet
from prunekit.structure.stages.score_units import Scored
from prunekit.structure.stages.shares import by_shares


def allocate(
    model: nn.Module, example_inputs: Any, scored: Scored, config: ChannelConfig
) -> list[PrunedGroup]:
    """The units to mask (nothing is changed).

    Args:
        model: the model the groups are of.
        example_inputs: its example inputs (a budget counts MACs or times the model on them).
        scored: the candidate groups and their scores.
        config: the checked options.

    Returns:
        The groups that lose units; with a budget, a ``BudgetReport``.

    Raises:
        ValueError: the budget cannot be met, or a router would keep fewer experts than it
            picks per token.
    """
    budget = config.budget
    if budget is None:
        return by_shares(scored.groups, scored.scores, config.amounts, config.scope,
                         config.round_to)  # fmt: skip
    probe = None
    if budget.measure == "latency":
        probe = latency_probe(model, example_inputs, budget.runs, install)
    return meet(model, example_inputs, scored.groups, scored.scores, budget, config.round_to,
                probe)  # fmt: skip
