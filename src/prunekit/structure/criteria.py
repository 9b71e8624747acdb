"""Importance of each unit of a channel group, aggregated over all of the group's slices.

Built in: 'l1' and 'l2' (norm of every parameter entry the unit owns), 'bn_scale' (|gamma| of
the group's norm layers; a group without one falls back to 'l2'), 'taylor' (|sum of w x grad|
over the unit's entries: the first-order change of the loss when the unit is removed; needs
gradients). A callable ``criterion(group) -> Tensor`` of one score per unit is used as given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from prunekit.structure.graph import ChannelGroup, Slice

Criterion = Callable[[ChannelGroup], Tensor]
CRITERIA = ("l1", "l2", "bn_scale", "taylor")


def group_scores(group: ChannelGroup, criterion: str | Criterion) -> Tensor:
    """One float64 score per unit of `group` (higher: more important)."""
    if callable(criterion):
        scores: Any = criterion(group)
        if not isinstance(scores, Tensor) or tuple(scores.shape) != (group.size,):
            found = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
            raise ValueError(
                f"prune_channels: criterion {criterion!r} returned {found} for group "
                f"{group.name}; expected a tensor of shape ({group.size},), one score per unit"
            )
        found_scores: Tensor = scores.detach().to(torch.float64).cpu()
        if not bool(torch.isfinite(found_scores).all()):
            raise ValueError(f"prune_channels: criterion {criterion!r} gave non-finite scores")
        return found_scores
    params = [s for s in group.slices if not s.is_buffer]
    if criterion == "bn_scale":
        norms = [s for s in params if s.role == "norm" and s.name == "weight"]
        if norms:
            return _sum(group, norms, lambda s: _values(s).abs())
        criterion = "l2"
    if criterion == "l1":
        return _sum(group, params, lambda s: _values(s).abs())
    if criterion == "l2":
        return _sum(group, params, lambda s: _values(s).square()).sqrt()
    if criterion == "taylor":
        return _sum(group, params, lambda s: _values(s) * _grad(s)).abs()
    raise ValueError(
        f"prune_channels: unknown criterion={criterion!r}; expected one of {list(CRITERIA)} "
        "or a callable(group) -> Tensor of one score per unit"
    )


def _values(s: Slice) -> Tensor:
    value: Tensor = getattr(s.module, s.name)
    return value.detach().to(torch.float64)


def _grad(s: Slice) -> Tensor:
    param = s.module._parameters.get(s.name + "_orig", s.module._parameters.get(s.name))
    if param is None or param.grad is None:
        raise ValueError(
            f"prune_channels: criterion='taylor' needs gradients, but {s.qualified} has no "
            ".grad; run a backward pass (loss.backward()) on the model first"
        )
    return param.grad.detach().to(torch.float64)


def _sum(group: ChannelGroup, slices: list[Slice], entry: Callable[[Slice], Tensor]) -> Tensor:
    """Sum of `entry` over the positions each unit owns, over all slices."""
    total = torch.zeros(group.size, dtype=torch.float64)
    for s in slices:
        values = entry(s).movedim(s.dim, 0)
        per_position = values.reshape(values.shape[0], -1).sum(1)
        units = [u for u, positions in enumerate(s.indices) for _ in positions]
        flat = [p for positions in s.indices for p in positions]
        total.index_add_(0, torch.tensor(units, dtype=torch.long), per_position[flat])
    return total
