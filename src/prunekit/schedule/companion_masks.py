"""What else a gradually emptied channel must lose so that it carries exactly zero.

A pruner with ``pattern='channels'`` masks the output rows of weights. A channel whose rows
are all masked still carries its bias, and after a norm layer beta - mean x gamma / std: a
constant that ``compact`` cannot fold into a zero-padded convolution. Given example inputs,
``Companions`` traces the channel groups once and, after each update, masks the bias, norm
and element-wise parameters of every unit whose producing rows are all masked, as
``prune_channels`` masks a whole unit; the channel then carries 0 and ``compact`` removes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.naming import stored_parameter
from prunekit.structure.graph.graph import Slice, channel_groups
from prunekit.whole.targets import Place, Target

__all__ = ["Companions"]

ROLES = ("bias", "norm", "element")  # the per-channel parameters a producer adds


@dataclass(frozen=True)
class _Group:
    makers: tuple[tuple[Place, int, tuple[tuple[int, ...], ...]], ...]  # place, dim, per unit
    others: tuple[tuple[Place, int, tuple[tuple[int, ...], ...]], ...]
    size: int


class Companions:
    """The groups of `model`'s channels whose producing weights are all among `targets`."""

    def __init__(self, model: nn.Module, example_inputs: Any, targets: list[Target]) -> None:
        ranked = {id(t.first.parameter()): t.first for t in targets}
        self.groups: list[_Group] = []
        for g in channel_groups(model, example_inputs):
            if not g.prunable or g.kind != "channels":
                continue
            makers = [s for s in g.slices if s.role == "out"]
            if not makers or any(_held_by(s) not in ranked for s in makers):
                continue
            others = [
                (Place(s.module, s.name, s.module, s.name), s.dim, s.indices)
                for s in g.slices
                if s.role in ROLES and not s.is_buffer
                and stored_parameter(s.module, s.name) is not None
                and _held_by(s) not in ranked
            ]  # fmt: skip
            if others:
                made = tuple((ranked[_held_by(s)], s.dim, s.indices)
                             for s in makers)  # fmt: skip
                self.groups.append(_Group(made, tuple(others), g.size))

    @property
    def places(self) -> list[Place]:
        """Every place that gets a companion mask, once each."""
        found: dict[tuple[int, str], Place] = {}
        for g in self.groups:
            for place, _, _ in g.others:
                found.setdefault((id(place.holder), place.own), place)
        return list(found.values())

    def masks(self) -> list[tuple[Place, Tensor]]:
        """The mask of each place: 0 at the positions of units whose makers are all masked
        (and wherever its current mask is 0 already: nothing comes back)."""
        out: dict[tuple[int, str], tuple[Place, Tensor]] = {}
        for place in self.places:
            current = place.mask()
            value = place.parameter()
            mask = torch.ones_like(value) if current is None else current.to(value.dtype).clone()
            out[(id(place.holder), place.own)] = (place, mask)
        for g in self.groups:
            dead = torch.ones(g.size, dtype=torch.bool)
            for place, dim, indices in g.makers:
                dead &= ~_alive(place.mask(), dim, indices, g.size)
            units = torch.nonzero(dead).flatten().tolist()
            if not units:
                continue
            for place, dim, indices in g.others:
                mask = out[(id(place.holder), place.own)][1]
                positions = [p for u in units for p in indices[u]]
                mask.index_fill_(dim, torch.tensor(positions, device=mask.device), 0)
        return list(out.values())


def _held_by(s: Slice) -> int:
    """The identity of the Parameter holding the slice's tensor (of None for a buffer)."""
    return id(stored_parameter(s.module, s.name))


def _alive(
    mask: Tensor | None, dim: int, indices: tuple[tuple[int, ...], ...], size: int
) -> Tensor:
    """Per unit: whether `mask` keeps an entry of its positions along `dim`."""
    if mask is None:
        return torch.ones(size, dtype=torch.bool)
    rows = mask.movedim(dim, 0).reshape(mask.shape[dim], -1).ne(0).any(1).cpu()
    return torch.tensor([bool(rows[list(p)].any()) if p else False for p in indices])
