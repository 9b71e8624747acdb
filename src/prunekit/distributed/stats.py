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
    weight: float | Mapping[str, float] | None = None,
) -> dict[str, Tensor]:
    """The statistics summed over the ranks of `process_group` (None: the default group),
    as new tensors in a new dict (the inputs are left as they are).

    With `weight` (this rank's number of samples, say), each rank's statistics count in
    proportion to it: the result is ``sum(weight_r * stats_r) / sum(weight_r)``, the
    mean over all samples of statistics that are means over each rank's samples (a
    SparseGPT Hessian, the mean of X^T X). `weight` may be one number for all, or one per
    name (names it leaves out are summed). Every rank must pass the same names, shapes
    and dtypes, in the same order.
    """
    group = group_of(process_group, _OWNER)
    weights = _checked(statistics, weight)
    layout = [(n, tuple(t.shape), str(t.dtype), weights[n] is None) for n, t in statistics.items()]
    everyone = group.objects(layout)
    if any(found != layout for found in everyone):
        differ = [r for r, found in enumerate(everyone) if found != everyone[0]]
        raise value_error(
            f"{_OWNER}: rank(s) {differ} pass other names, shapes, dtypes or weighting "
            "than rank 0; expected the same statistics on every rank"
        )
    weighted = [n for n in statistics if weights[n] is not None]
    mine = torch.tensor([weights[n] for n in weighted], dtype=torch.float64)
    totals = dict(zip(weighted, _sum(mine, group).tolist(), strict=True))
    for n, total in totals.items():
        if total <= 0:
            raise value_error(f"{_OWNER}: the weights of {n!r} sum to {total}; expected > 0")
    result: dict[str, Tensor] = {}
    # One buffer per dtype; weighted statistics travel as float64, already weighted.
    buffers: dict[torch.dtype, list[str]] = {}
    for n, t in statistics.items():
        buffers.setdefault(torch.float64 if n in totals else t.dtype, []).append(n)
    for names in buffers.values():
        parts = []
        for n in names:
            part = statistics[n].detach().reshape(-1).cpu()
            w = weights[n]
            parts.append(part if w is None else part.to(torch.float64) * w)
        flat = _sum(torch.cat(parts), group)
        offset = 0
        for n in names:
            t = statistics[n]
            part = flat[offset : offset + t.numel()]
            if n in totals:
                part = (part / totals[n]).to(t.dtype)
            result[n] = part.view(t.shape).to(t.device)
            offset += t.numel()
    return {n: result[n] for n in statistics}


def _checked(
    statistics: Mapping[str, Tensor], weight: float | Mapping[str, float] | None
) -> dict[str, float | None]:
    """Each statistic's weight (None: summed), after checking the arguments."""
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
    given = weight if isinstance(weight, Mapping) else dict.fromkeys(statistics, weight)
    for name, w in given.items():
        if name not in statistics:
            raise value_error(f"{_OWNER}: weight for {name!r}, which is not a statistic")
        ok = w is None or (isinstance(w, int | float) and not isinstance(w, bool) and w >= 0)
        if not ok:
            raise value_error(f"{_OWNER}: invalid weight={w!r}; expected a number >= 0")
    found: dict[str, float | None] = {}
    for n in statistics:
        w = given.get(n)
        found[n] = None if w is None else float(w)
    return found


def _sum(flat: Tensor, group: Group) -> Tensor:
    """`flat` summed over the ranks, in its own dtype."""
    if group.size == 1:
        return flat
    return group.sum(flat)
