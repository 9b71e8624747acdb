"""What the units of channel groups cost, counted as ``compact`` will remove them: the
parameters (or MACs) of each tensor they slice, and a ledger of what the units chosen so
far remove (a weight that loses rows and columns to two groups loses their product once).
Read by the budget half of the allocate stage (``meet_budget``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from prunekit.core.naming import stored_parameter
from prunekit.structure.budget import Budget
from prunekit.structure.depth.blocks import is_skipped
from prunekit.structure.graph.graph import ChannelGroup, Slice, split_inputs
from prunekit.structure.measure import macs_per_entry


@dataclass
class TensorCost:
    """A parameter's shape, what one of its entries costs, and the positions removed (per
    dim, each position with how many of the units counted remove it)."""

    shape: tuple[int, ...]
    weight: float
    removed: dict[int, dict[int, int]] = field(default_factory=dict)

    def cost(self) -> float:
        kept = math.prod(n - len(self.removed.get(d, ())) for d, n in enumerate(self.shape))
        return self.weight * (math.prod(self.shape) - kept)


def untouched(tensors: dict[int, TensorCost]) -> dict[int, TensorCost]:
    """A copy of `tensors` with nothing removed, for a ledger of its own (a ledger's
    removals are kept in its tensors)."""
    return {k: TensorCost(t.shape, t.weight) for k, t in tensors.items()}


class Ledger:
    """What the units chosen so far remove, counted per tensor as compact slices them; units
    can be put back (``restore``), in any order."""

    def __init__(self, tensors: dict[int, TensorCost], units: bool = False) -> None:
        self.tensors = tensors
        self.units = units
        self.removed = 0.0

    def remove(self, group: ChannelGroup, units: tuple[int, ...], rate: float = 1.0) -> None:
        """Count `units` of `group` as removed, what they save times `rate` (with `units`
        set at construction, the units themselves)."""
        if self.units:
            self.removed += rate * len(units)
            return
        self._count(group, units, rate, 1)

    def restore(self, group: ChannelGroup, units: tuple[int, ...], rate: float = 1.0) -> None:
        """Put back `units` of `group`, counted as removed before with the same `rate`."""
        if self.units:
            self.removed -= rate * len(units)
            return
        self._count(group, units, rate, -1)

    def _count(self, group: ChannelGroup, units: tuple[int, ...], rate: float, sign: int) -> None:
        for s in costed(group):
            t = self.tensors.get(tensor_key(s))
            if t is None:
                continue
            before = t.cost()
            held = t.removed.setdefault(s.dim, {})
            for p in (p for u in units for p in s.indices[u]):
                held[p] = held.get(p, 0) + sign
                if not held[p]:
                    del held[p]
            self.removed += rate * (t.cost() - before)


def entry_weights(model: nn.Module, example_inputs: Any, budget: Budget) -> dict[int, float]:
    """What one entry of each parameter counts for, by the Parameter's id."""
    if budget.measure in ("macs", "latency"):  # a latency budget weighs MACs by its rates
        args, kwargs = split_inputs(example_inputs, "prune_channels")
        modes = [(m, m.training) for m in model.modules()]
        model.eval()  # counting must not move a BatchNorm's running statistics
        try:
            counted = macs_per_entry(model, args, kwargs)
        finally:
            for m, mode in modes:
                m.training = mode
        return {k: float(v) for k, v in counted.items()}
    embedded: set[int] = set()
    if not budget.embeddings:
        for m in model.modules():
            if isinstance(m, nn.Embedding | nn.EmbeddingBag):
                embedded.update(id(p) for p in m._parameters.values() if p is not None)
    return {id(p): 0.0 if id(p) in embedded else 1.0 for p in unique_parameters(model)}


def unit_costs(group: ChannelGroup, tensors: dict[int, TensorCost]) -> list[float]:
    """What removing each unit alone would save."""
    costs = [0.0] * group.size
    for s in costed(group):
        t = tensors[tensor_key(s)]
        per_position = t.weight * math.prod(t.shape) / t.shape[s.dim]
        for u, positions in enumerate(s.indices):
            costs[u] += per_position * len(positions)
    return costs


def in_skipped_blocks(model: nn.Module) -> list[nn.Parameter]:
    """The parameters that go with the skipped blocks: held by no module outside them."""
    inside: set[int] = set()
    found: dict[int, nn.Parameter] = {}
    for block in model.modules():
        if is_skipped(block):
            for m in block.modules():
                inside.add(id(m))
                found.update((id(p), p) for p in m._parameters.values() if p is not None)
    for m in model.modules():
        if id(m) not in inside:
            for p in m._parameters.values():
                found.pop(id(p), None)
    return list(found.values())


def unique_parameters(model: nn.Module) -> list[nn.Parameter]:
    return list({id(p): p for p in model.parameters()}.values())


def costed(group: ChannelGroup) -> list[Slice]:
    held = [(s, stored_parameter(s.module, s.name)) for s in group.slices if not s.is_buffer]
    return [s for s, param in held if param is not None]


def costed_parameter(s: Slice) -> nn.Parameter:
    """The Parameter of a costed slice (its ``_orig`` when pruned)."""
    found = stored_parameter(s.module, s.name)
    assert found is not None, s.qualified
    return found


def tensor_key(s: Slice) -> int:
    return id(stored_parameter(s.module, s.name))
