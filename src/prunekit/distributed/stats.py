"""Calibration statistics (activation norms, Hessians) summed or averaged over data-parallel ranks.

Each rank calibrates on its own batches; before a criterion reads its statistics, every
rank calls `all_reduce_statistics`, and all then hold the statistics of all the batches,
as if one process had seen them. Tensors of one dtype travel in one flat buffer, so a
call costs one collective per dtype, whatever the number of statistics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from prunekit.core.errors import type_error, value_error
from prunekit.distributed.group import Group, group_of

__all__ = ["all_reduce_statistics"]

_OWNER = "all_reduce_statistics"


def all_reduce_statistics(
    statistics: Mapping[str, Tensor],
    process_group: Any = None,
    *,
    weight: float | None = None,
) -> dict[str, Tensor]:
    """The statistics summed over the ranks of `process_group` (None: the default group),
    as new tensors in a new dict (the inputs are left as they are).

    With `weight` (this rank's number of samples, say), each rank's statistics count in
    proportion to it: the result is ``sum(weight_r * stats_r) / sum(weight_r)``, the
    mean over all samples of statistics that are means over each rank's samples (a
    SparseGPT Hessian ``2/n X X^T``, a mean squared activation norm). Every rank must pass
    the same names, shapes and dtypes, in the same order.
    """
    group = group_of(process_group, _OWNER)
    if not isinstance(statistics, Mapping):
        raise type_error(
            f"{_OWNER}: invalid statistics of type {type(statistics).__name__}; expected a "
            "dict of names to tensors"
        )
    for name, t in statistics.items():
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise type_error(
                f"{_OWNER}: statistics[{name!r}] is {type(t).__name__} "
                f"{getattr(t, 'dtype', '')}; expected a floating-point tensor"
            )
    if weight is not None and not (isinstance(weight, int | float) and weight >= 0):
        raise value_error(f"{_OWNER}: invalid weight={weight!r}; expected a number >= 0")
    layout = [(n, tuple(t.shape), str(t.dtype)) for n, t in statistics.items()]
    everyone = group.objects(layout)
    if any(found != layout for found in everyone):
        differ = [r for r, found in enumerate(everyone) if found != everyone[0]]
        raise value_error(
            f"{_OWNER}: rank(s) {differ} pass other names, shapes or dtypes than rank 0; "
            "expected the same statistics on every rank"
        )
    total = 1.0
    if weight is not None:
        total = float(group.sum(torch.tensor([float(weight)], dtype=torch.float64))[0])
        if total <= 0:
            raise value_error(f"{_OWNER}: the weights sum to {total}; expected more than 0")
    result: dict[str, Tensor] = {}
    for dtype in dict.fromkeys(t.dtype for t in statistics.values()):
        names = [n for n, t in statistics.items() if t.dtype == dtype]
        flat = torch.cat([statistics[n].detach().reshape(-1).cpu() for n in names])
        if weight is not None:
            flat = flat.to(torch.float64).mul_(weight)
        flat = _sum(flat, group)
        if weight is not None:
            flat = flat.div_(total).to(dtype)
        offset = 0
        for n in names:
            t = statistics[n]
            result[n] = flat[offset : offset + t.numel()].view(t.shape).to(t.device)
            offset += t.numel()
    return {n: result[n] for n in statistics}


def _sum(flat: Tensor, group: Group) -> Tensor:
    """`flat` summed over the ranks, in its own dtype."""
    if group.size == 1:
        return flat
    return group.sum(flat)
