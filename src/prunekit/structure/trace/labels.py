"""Helpers on label tensors: one id per channel, where labels vary, broadcasting ids back."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from prunekit.structure.trace.tracer import Tracer


def channel_ids(tr: Tracer, labels: Tensor | None, dim: int, size: int, why: str) -> Tensor:
    """One id per position along `dim` (-1: none), for an op that reads whole channels.

    Ids sharing a channel are merged (they must go together); a channel partly made of
    unlabeled values blocks its ids, since it cannot be removed.
    """
    if labels is None:
        return torch.full((size,), -1, dtype=torch.long)
    known = tr.flat(labels, dim)
    if known is not None:  # one id per channel already, as they were made
        return known
    if one_dim(labels) == dim:  # one id per channel already: nothing mixed
        return core(labels).reshape(size)
    rows = core(labels, keep=dim).movedim(dim, 0).reshape(size, -1)
    if rows.shape[1] == 0:
        return torch.full((size,), -1, dtype=torch.long)
    if rows.shape[1] == 1:  # one value per channel: nothing mixed
        return rows[:, 0].clone()
    low, high = rows.amin(1), rows.amax(1)
    mixed = (low != high).nonzero().flatten()
    if len(mixed):
        parts = rows[mixed]
        partial = (parts < 0).any(1)
        tr.block(parts[partial], f"{why}: a channel there mixes them with values of no channel")
        tr.merge(high[mixed].unsqueeze(1).expand_as(parts), parts)
    return high


def one_dim(labels: Tensor) -> int | None:
    """The one dim the labels are stored along (every other is broadcast or of size 1): they
    carry one id per position of it, read with ``core(labels).reshape(-1)``. None when they
    are stored along several dims or none (the ids may still vary along one only)."""
    found = None
    for d, (size, stride) in enumerate(zip(labels.shape, labels.stride(), strict=True)):
        if size > 1 and stride != 0:
            if found is not None:
                return None
            found = d
    return found


def varying(labels: Tensor) -> list[int]:
    """The dims along which the labels change."""
    labels = core(labels)
    dims = []
    for d in range(labels.dim()):
        if labels.shape[d] > 1 and not bool((labels == labels.narrow(d, 0, 1)).all()):
            dims.append(d)
    return dims


def core(labels: Tensor, keep: int = -1) -> Tensor:
    """The labels without the dims they are broadcast along (a view, those dims of size 1;
    `keep`: a dim left whole): the same values, each position of the other dims once."""
    for d, (size, stride) in enumerate(zip(labels.shape, labels.stride(), strict=True)):
        if stride == 0 and size > 1 and d != keep:
            labels = labels.narrow(d, 0, 1)
    return labels


def either(first: Tensor, second: Tensor) -> Tensor:
    """`first` where it has an id, else `second` (both of one shape), computed once along the
    dims both are broadcast along and broadcast there again."""
    a, b = first, second
    for d in range(a.dim()):
        if a.shape[d] > 1 and a.stride(d) == 0 and b.stride(d) == 0:
            a, b = a.narrow(d, 0, 1), b.narrow(d, 0, 1)
    return torch.where(a >= 0, a, b).expand(first.shape)


def along(ids: Tensor, dim: int, shape: torch.Size | tuple[int, ...]) -> Tensor:
    """Ids (one per position of `dim`) broadcast to `shape`."""
    view = [1] * len(shape)
    view[dim] = len(ids)
    return ids.reshape(view).expand(shape)


def positive(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim
