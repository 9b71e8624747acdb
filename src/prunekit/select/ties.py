"""The tie rule every path keeps: of the entries equal to the k-th value, the first in order go.

"First in order" is by tensor (their order, or their key in pieces), then by flat position
in the tensor. The paths count the ties where they fall (per source, per key, per run of a
shard, per chunk) and hand the ones to choose out in that order with `first`; within a
chunk, `positions` (torch) or `only_first` (plain tensor methods, any framework) pick them.
Entries few enough to rank as one vector are chosen at once by `select_sorted` (the engine's
settling of what it gathered, the portable path's inputs of one chunk).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import Tensor

from prunekit.select import tuning

__all__ = ["first", "only_first", "positions", "select_sorted"]


def first(counts: Iterable[int], take: int) -> Iterator[int]:
    """For holders of `counts` ties each, in order: how many each gives when the first
    `take` ties of all of them are chosen (all of a holder's while they last, then part
    of one, then none)."""
    for count in counts:
        mine = min(count, take)
        take -= mine
        yield mine


def positions(equal: Tensor, take: int) -> Tensor:
    """The flat positions of the first `take` ties of a chunk: where the 1-D `equal`
    (bools or 0/1) is nonzero, in order, at most `take` of them."""
    return equal.nonzero().reshape(-1)[:take]


def only_first(equal: Tensor, take: int) -> Tensor:
    """The 1-D bool tensor `equal` (of any framework) with only its first `take` True left."""
    kept: Tensor = equal & (equal.cumsum(0) <= take)
    return kept


def select_sorted(flat: Tensor, k: int) -> Tensor:
    """The k smallest of a 1-D tensor via kthvalue (a stable sort if tiny), ties by lowest
    index, NaN last (kthvalue and the sort rank it last)."""
    if isinstance(flat, Tensor) and flat.numel() <= tuning.get().tiny:
        chosen_few = torch.zeros(flat.shape, dtype=torch.bool, device=flat.device)
        chosen_few[torch.argsort(flat, stable=True)[:k]] = True
        return chosen_few
    threshold = flat.kthvalue(k)[0]
    if bool(threshold != threshold):  # NaN: every other value is below it
        chosen, at_threshold = flat == flat, flat != flat
    else:
        chosen, at_threshold = flat < threshold, flat == threshold
    missing = k - int(chosen.sum())
    if int(at_threshold.sum()) > missing:
        at_threshold = only_first(at_threshold, missing)
    result: Tensor = chosen | at_threshold
    return result
