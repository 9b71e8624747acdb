"""The compensate stage: the layers that read removed units updated to keep their outputs.

It runs around the install stage. Before the masks go on, it refuses units whose readers
cannot be updated, declares to the call's transaction the tensors it will write in place
(or copies the model, for the refit towards it), and records the producers' masks as they
were (``Openings``); after, ``Compensation.apply`` runs the least-squares update
(``prunekit.structure.compensation.compensate``) or the refit towards the model as it was
(``prunekit.structure.compensation.refit``) on the calibration batches.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from prunekit.core.errors import value_error
from prunekit.core.transaction import Transaction
from prunekit.structure.compensation.compensate import (
    Openings,
    compensate_groups,
    refuse_uncompensable,
    written,
)
from prunekit.structure.compensation.refit import refit_groups
from prunekit.structure.compensation.refit import written as refitted
from prunekit.structure.graph.graph import ChannelGroup
from prunekit.structure.pruned import PrunedGroup
from prunekit.structure.stages.channel_config import OWNER, ChannelConfig


@dataclass(frozen=True)
class Compensation:
    """What the compensate stage hands on to run after the install stage.

    Attributes:
        pairs: each group and the units of it removed.
        openings: the producers' masks as they were before the install stage.
        batches: the calibration batches.
        level: the damping of the least-squares update.
        tokens: how the update weighs the calibration tokens ('energy' or 'equal').
        reference: a copy of the model as it was (the refit), or None (the update).
    """

    pairs: list[tuple[ChannelGroup, Sequence[int]]]
    openings: Openings
    batches: list[Any]
    level: float | str
    tokens: str
    reference: nn.Module | None

    def apply(self, model: nn.Module) -> None:
        """Update the layers of `model` (masked by now) that read the removed units."""
        if self.reference is not None:
            refit_groups(model, self.reference, self.pairs, self.openings, self.batches)
        else:
            compensate_groups(model, self.pairs, self.openings, self.batches, self.level,
                              self.tokens, owner=OWNER)  # fmt: skip


def _refuse_tied(model: nn.Module, updated: Sequence[Tensor], compensate: object) -> None:
    """Refuse to update in place a weight tied to another layer's (one Parameter in two
    Linears or convolutions): the update fits one layer's inputs and would move the other's
    output unchecked (on a small MLP pair, worse than no update on the calibration data)."""
    layers: dict[int, dict[int, str]] = {}  # a Parameter's id -> its layers' ids -> a name
    for path, module in model.named_modules():
        conv = isinstance(module, nn.modules.conv._ConvNd)
        if not (conv or isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"):
            continue
        for name, parameter in module._parameters.items():
            if parameter is not None:
                held = layers.setdefault(id(parameter), {})
                held.setdefault(id(module), f"{path}.{name}".lstrip("."))
    for tensor in updated:
        names = list(layers.get(id(tensor), {}).values())
        if len(names) > 1:
            raise value_error(
                f"{OWNER}: compensate={compensate!r} would update {names[0]!r} in place, but "
                f"{', '.join(map(repr, names))} are one Parameter (tied) of layers that read "
                "other inputs, whose outputs the update would move unchecked; expected "
                "compensate=False, or the layers untied"
            )


def plan_compensation(
    model: nn.Module, chosen: list[PrunedGroup], config: ChannelConfig, recorded: Transaction
) -> Compensation | None:
    """Ready the compensation of `chosen` before the install stage (None: no compensation).

    Args:
        model: the model, not masked yet.
        chosen: the groups and the units of each to mask.
        config: the checked options.
        recorded: the call's transaction, told of the tensors compensation writes in place.

    Returns:
        What to apply after the install stage, or None where the config compensates nothing.

    Raises:
        ValueError: a removed unit is read by a layer that cannot be updated.
    """
    batches = config.batches
    if batches is None:
        return None
    pairs: list[tuple[ChannelGroup, Sequence[int]]] = [(p.group, p.units) for p in chosen]
    refuse_uncompensable(pairs, config.compensate)
    reference = None
    updated = written(pairs)  # the consumers of removed units, refitted or updated
    if config.compensate == "reference":  # and the layers the refit takes besides them
        updated += refitted(model)
    _refuse_tied(model, updated, config.compensate)
    recorded.keep(updated)  # compensation (or the refit) updates them in place
    if config.compensate == "reference":
        reference = copy.deepcopy(model)
    return Compensation(
        pairs, Openings(model, pairs), batches, config.level, config.token_weights, reference
    )
