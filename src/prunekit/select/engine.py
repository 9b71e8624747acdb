"""The one driver every selection runs: its steps in order, each made by a strategy.

A selection takes the same steps whatever it ranks: all or none when k says so; a
shortcut where one read settles it; a sampled guess of where the k-th value lies; one
count pass about that guess; the k-th value refined from what the pass gathered (or, where
the guess missed, over the scores); the first of its ties in order; the marks. `run`
writes that order once. A `Steps` object makes each step for one kind of input:

- the engine's (pieces.Bits): CPU torch floats (magnitudes or signed values), pieces over
  a group of processes, the count pass a C loop (or tensor operations), the k-th value
  from histograms of bits, the ties shared per piece, each piece marked when asked;
- the portable one (portable.Portable): any framework, device and dtype, and small
  inputs, in plain tensor methods a chunk at a time; its k-th value is refined in
  rounds of narrowing pivots, its ties taken in chunk order as it marks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from prunekit.select.inputs import Count, count_of
from prunekit.select.sample import Bounds

__all__ = ["Chosen", "Counts", "Cut", "Steps", "run"]


class Chosen(Protocol):
    """A selection made: how many were chosen among how many competing (None: not known
    here), the marks already written (`held`, or None), and every mask in order."""

    @property
    def k(self) -> int | None: ...

    @property
    def total(self) -> int | None: ...

    @property
    def held(self) -> list[Tensor] | None: ...

    def masks(self, keep_dtype: torch.dtype | None) -> Iterator[Tensor]: ...


class Counts(Protocol):
    """What a count pass found: competing entries below the lower bound, and how many lie
    between the bounds and were gathered (-1: too many to gather)."""

    @property
    def below(self) -> int: ...

    @property
    def kept(self) -> int: ...


@dataclass
class Cut:
    """The k-th smallest value (None: NaN, ranked after every other), how many of its
    ties, the first in order, are chosen, and how many equal it in all (-1: not known)."""

    value: float | None
    take: int
    equal: int = -1


S = TypeVar("S", bound=Chosen)
S_co = TypeVar("S_co", bound=Chosen, covariant=True)
C = TypeVar("C", bound=Counts)


class Steps(Protocol[S_co, C]):
    """The steps of one selection, for one kind of input (see the module)."""

    total: int | None  # entries competing in all, if known before the count pass

    def all_or_none(self, k: int, total: int, found: C | None) -> S_co:
        """None chosen (k = 0) or every competing entry; `found` if counted first."""
        ...

    def shortcut(self, k: int | None) -> S_co | None:
        """The selection in one read where the input allows (else None)."""
        ...

    def guess(self, k: Count, total: int | None) -> Bounds | None:
        """Bounds that almost surely enclose the k-th value (None: no guess)."""
        ...

    def count(self, bounds: Bounds | None) -> C | None:
        """The count pass about `bounds` (None: no pass was made)."""
        ...

    def known(
        self, found: C | None, count: Count, k: int | None, total: int | None
    ) -> tuple[int, int]:
        """(k, total) once the count pass is made (counted there if not known before);
        the scores checked as asked."""
        ...

    def one_read(self, found: C, rank: int) -> S_co | None:
        """The marks the count pass wrote, settled at `rank` among those gathered, if
        it wrote any (else None)."""
        ...

    def nth(self, found: C, rank: int) -> Cut:
        """The cut at the `rank`-th smallest of the entries the count pass gathered."""
        ...

    def search(self, found: C | None, k: int) -> Cut:
        """The cut at the k-th smallest of all, where the count pass did not gather it."""
        ...

    def selection(self, cut: Cut, k: int, total: int) -> S_co:
        """The selection at `cut`: every entry below it and its first `cut.take` ties."""
        ...


def run(steps: Steps[S, C], count: Count) -> S:
    """Choose ``count(total)`` entries, the smallest, ties to the first in order, through
    `steps` (see the module)."""
    total = steps.total
    k = None if total is None else count_of(count, total)
    if total is not None and k in (0, total):
        assert k is not None
        return steps.all_or_none(k, total, None)
    early = steps.shortcut(k)
    if early is not None:
        return early
    found = steps.count(steps.guess(count if k is None else k, total))
    k, total = steps.known(found, count, k, total)
    if k in (0, total):
        return steps.all_or_none(k, total, found)
    rank = 0 if found is None else k - found.below
    if found is not None and 0 < rank <= found.kept:  # the k-th lies between the bounds
        made = steps.one_read(found, rank)
        if made is not None:
            return made
        cut = steps.nth(found, rank)
    else:  # no guess, or it missed (or too much fell between): over the scores
        cut = steps.search(found, k)
    return steps.selection(cut, k, total)
