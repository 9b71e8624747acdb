"""Statistics reduced over data-parallel ranks, and every rank told of another's failure.

A `Reduce` is given from above (prunekit.distributed.stats.Reducer over a process group):
this package imports nothing of torch.distributed.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class Reduce(Protocol):
    """Statistics reduced over data-parallel ranks, and the ranks told of each other's
    failures (prunekit.distributed.stats.Reducer over a process group)."""

    def __call__(
        self, statistics: dict[str, Tensor], weights: dict[str, float]
    ) -> dict[str, Tensor]:
        """The statistics summed over the ranks, as new tensors; a name given a weight is
        averaged instead, ``sum(w_r * s_r) / sum(w_r)``. Every rank calls it with the same
        names, shapes and dtypes."""

    def settle(self, error: BaseException | None) -> None:
        """Every rank learns whether any failed (`error` on this one): if one did, every
        rank raises the same error."""


def agree(reduce: Reduce, error: BaseException | None, more: Tensor | None = None) -> Tensor:
    """Every rank learns whether any failed, and raises then (the same error on every
    rank); else returns `more` (float64) summed over the ranks."""
    reduce.settle(error)
    if more is None:
        return torch.zeros(0, dtype=torch.float64)
    return reduce({"calibration.counts": more.to(torch.float64)}, {})["calibration.counts"]
