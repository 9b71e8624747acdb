"""Calibration statistics (activation norms, Hessians) summed or averaged over data-parallel ranks.

Each rank calibrates on its own batches; before a criterion reads its statistics, every
rank calls `all_reduce_statistics`, and all then hold the statistics of all the batches,
as if one process had seen them. Tensors of one dtype travel in one flat buffer, so a
call costs one collective per dtype, whatever the number of statistics, after the start
of agree.py's protocol (the ranks compare names, shapes, dtypes and weighting first).
`Reducer` is the same over one collective call, as calibration (prunekit.calibrate)
takes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from prunekit.core.checks import check_kind
from prunekit.core.errors import type_error, value_error
from prunekit.distributed.agree import Collective, collective

__all__ = ["Reducer", "all_reduce_statistics"]

_OWNER = "all_reduce_statistics"


def all_reduce_statistics(
    statistics: Mapping[str, Tensor],
    process_group: object = None,
    *,
    weight: float | Mapping[str, float] | None = None,
) -> dict[str, Tensor]:
    """The statistics summed over the ranks of `process_group` (None: the default group),
    as new tensors in a new dict (the inputs are left as they are).

    With `weight` (this rank's number of samples, say), each rank's statistics count in
    proportion to it: the result is ``sum(weight_r * stats_r) / sum(weight_r)``, the
    mean over all samples of statistics that are means over each rank's samples (a
    SparseGPT Hessian, the mean of X^T X). Every rank must pass the same names, shapes,
    dtypes and weighting (which names are weighted), in any order; they are compared
    first.

    Args:
        statistics: names to floating-point tensors.
        process_group: a torch.distributed group (None: the default one), or a
            prunekit.distributed.TorchGroup to choose how long a rank waits.
        weight: one finite number >= 0 for all, or one per name (names it leaves out are
            summed); the weights of a name must not sum to 0 over the ranks.

    Returns:
        The reduced statistics, by name, of the inputs' shapes, dtypes and devices.

    Raises:
        ValueError, TypeError: on every rank, if any rank's statistics or weight is
            invalid or the ranks' names, shapes, dtypes or weighting differ.
        RanksTimeout: a rank waited for the others longer than the group's timeout.
    """
    group = collective(process_group, _OWNER)
    with group.telling():
        weights = _checked(statistics, weight)
        digest = {
            f"statistics[{n!r}]": (tuple(t.shape), t.dtype, weights[n] is not None)
            for n, t in statistics.items()
        }
        group.start(_OWNER, digest)
        return _reduced(statistics, weights, group)


def _reduced(
    statistics: Mapping[str, Tensor], weights: dict[str, float | None], group: Collective
) -> dict[str, Tensor]:
    names = sorted(statistics, key=repr)  # the same on every rank, whatever their order
    weighted = [n for n in names if weights[n] is not None]
    mine = torch.tensor([weights[n] for n in weighted], dtype=torch.float64)
    totals = dict(zip(weighted, _sum(mine, group).tolist(), strict=True))
    for n, total in totals.items():
        if not (0 < total < math.inf):
            raise value_error(
                f"{_OWNER}: the weights of {n!r} sum to {total} over the ranks; expected a "
                "finite sum > 0"
            )
    result: dict[str, Tensor] = {}
    # One buffer per dtype; weighted statistics travel as float64, each rank's already
    # multiplied by its share of the total weight (at most 1: no overflow from weights).
    buffers: dict[torch.dtype, list[str]] = {}
    for n in names:
        buffers.setdefault(torch.float64 if n in totals else statistics[n].dtype, []).append(n)
    for members in buffers.values():
        parts = []
        for n in members:
            part = statistics[n].detach().reshape(-1).cpu()
            w = weights[n]
            parts.append(part if w is None else part.to(torch.float64) * (w / totals[n]))
        flat = _sum(torch.cat(parts), group)
        offset = 0
        for n in members:
            t = statistics[n]
            part = flat[offset : offset + t.numel()]
            result[n] = part.to(t.dtype).view(t.shape).to(t.device)
            offset += t.numel()
    return {n: result[n] for n in statistics}


class Reducer:
    """prunekit.calibrate's Reduce over one collective call: statistics reduced with
    all_reduce_statistics, and the protocol's steps (see agree.py) for the failures.

    `digest` (the caller's arguments every rank must give alike) is compared at the
    first `settle`, once calibration's own checks passed.
    """

    def __init__(self, group: Collective, call: str, digest: Mapping[str, Any]) -> None:
        self.group = group
        self.call = call
        self.digest: Mapping[str, Any] | None = digest

    def __call__(
        self, statistics: dict[str, Tensor], weights: dict[str, float]
    ) -> dict[str, Tensor]:
        return all_reduce_statistics(statistics, self.group, weight=weights)

    def settle(self, error: BaseException | None) -> None:
        """Raise on every rank if any rank failed (`error` here) or, the first time, if the
        ranks' arguments differ."""
        if error is not None:
            self.group.fail(error)
        if self.digest is not None:
            digest, self.digest = self.digest, None
            self.group.start(self.call, digest)
        else:
            self.group.finish()


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
        check_kind(t, _OWNER, f"statistics[{name!r}]")  # meta, sparse: no values to sum
        if t.is_nested:
            raise value_error(
                f"{_OWNER}: statistics[{name!r}] is a nested tensor; expected a dense "
                "(strided) tensor of one shape"
            )
    if not (weight is None or isinstance(weight, Mapping)):
        _weight(weight, "weight")
    given = weight if isinstance(weight, Mapping) else dict.fromkeys(statistics, weight)
    found: dict[str, float | None] = dict.fromkeys(statistics)
    for name, w in given.items():
        if name not in statistics:
            raise value_error(
                f"{_OWNER}: weight for {name!r}, which is not a statistic; expected names "
                f"of statistics ({', '.join(map(repr, statistics))})"
            )
        found[name] = None if w is None else _weight(w, f"weight[{name!r}]")
    return found


def _weight(w: Any, what: str) -> float:
    """`w` as a float, if it is a finite number >= 0."""
    number = isinstance(w, int | float) and not isinstance(w, bool)
    if not number:
        raise type_error(
            f"{_OWNER}: invalid {what}={w!r} of type {type(w).__name__}; expected a "
            "finite number >= 0 (this rank's sample count, say)"
        )
    if not (0 <= w < math.inf):  # NaN fails too
        raise value_error(f"{_OWNER}: invalid {what}={w!r}; expected a finite number >= 0")
    return float(w)


def _sum(flat: Tensor, group: Collective) -> Tensor:
    """`flat` summed over the ranks, in its own dtype."""
    if group.size == 1:
        return flat
    return group.sum(flat)
