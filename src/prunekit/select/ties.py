"""The tie rule every path keeps: of the entries equal to the k-th value, the first in order go.

"First in order" is by tensor (their order, or their key in pieces), then by flat position
in the tensor. The paths count the ties where they fall (per source, per key, per run of a
shard, per chunk) and hand the ones to choose out in that order with `first`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["first"]


def first(counts: Iterable[int], take: int) -> Iterator[int]:
    """For holders of `counts` ties each, in order: how many each gives when the first
    `take` ties of all of them are chosen (all of a holder's while they last, then part
    of one, then none)."""
    for count in counts:
        mine = min(count, take)
        take -= mine
        yield mine
