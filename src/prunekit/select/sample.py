"""The sampled guess, shared by every path: an evenly spaced sample and the bounds it gives.

An evenly spaced sample of about `tuning.sample` values, its spacing prime to 2,
3, 5 and 7 so that rows, columns and kernel positions all show up, gives two
bounds from its order statistics, `tuning.spread` standard deviations either
side of the k-th value's expected place: the k-th smallest almost surely lies
between them. Both strategies of the one driver (engine.run) take their guess here:
the engine's over a group of processes, bounds that may lie outside the sample (0 or
infinity), the portable one's `inside` the sample, with how many entries are expected
between them (its later rounds take theirs from a sample of the values still in
question, with `within`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from prunekit.core.backend import namespace
from prunekit.select import tuning
from prunekit.select.inputs import Count, Source, count_of
from prunekit.select.process_group import Group
from prunekit.select.strategy import Route

__all__ = [
    "Bounds",
    "Spaced",
    "coprime",
    "enclose",
    "guess",
    "in_question",
    "margin",
    "places",
    "spaced",
    "stride",
    "within",
]


class Bounds(NamedTuple):
    """Values that almost surely enclose the k-th smallest (lower <= upper), the best
    guess of it in between, and how many entries are expected between the bounds (-1:
    not estimated). The first three are what the count pass takes."""

    lower: float
    mid: float
    upper: float
    expected: float = -1


@dataclass
class Spaced:
    """An evenly spaced sample: the competing values taken (None: no source), how many
    entries were taken (competing or not), and whether any source had flags."""

    values: Tensor | None
    seen: int
    flagged: bool


def spaced(sources: Sequence[Source], step: int, dtype: Any, magnitude: bool = True) -> Spaced:
    """Every `step`-th entry of each source (from its first), in `dtype` (|score| with
    `magnitude`), those that compete only, the sources in order. Plain tensor methods:
    any framework."""
    parts = []
    seen = 0
    flagged = False
    for source in sources:
        scores, alive = source()
        part = scores.detach().reshape(-1)[::step]
        if part.dtype != dtype:
            part = part.to(dtype)
        if magnitude:
            part = part.abs()
        seen += part.numel()
        if alive is not None:
            flags = alive.reshape(-1)[::step]
            part = part[flags if flags.dtype == namespace(flags).bool else flags == 1]
            flagged = True
        parts.append(part)
    if not parts:
        return Spaced(None, seen, flagged)
    values = parts[0] if len(parts) == 1 else namespace(parts[0]).cat(parts)
    return Spaced(values, seen, flagged)


def enclose(
    sample: Tensor, shares: Sequence[float], inside: bool = False, floor: float = 0.0
) -> tuple[float, float]:
    """Two values of the sample (of any framework) that almost surely enclose the entries
    at `shares` (as shares of all) of what it samples (see `places`). Where a bound falls
    outside the sample it is none: `floor` below (0 for magnitudes), infinity above, or
    with `inside` the sample's least or greatest value."""
    size = sample.numel()
    low, high = places(shares, size)
    if inside:
        low, high = min(max(low, 1), size), min(max(high, 1), size)
    # .item(): the sample's own type (integer scores stay exact)
    lower: float = sample.kthvalue(low)[0].item() if low >= 1 else floor
    upper: float = sample.kthvalue(high)[0].item() if high <= size else math.inf
    return lower, upper


def guess(
    sources: Sequence[Source],
    k: Count,
    total: int | None,
    plan: Route,
    group: Group,
    *,
    inside: bool = False,
    magnitude: bool = True,
) -> Bounds | None:
    """Bounds that very likely enclose the k-th smallest (of magnitudes, or with
    `magnitude` off of values), from an evenly spaced sample of `sources` on every rank of
    `group` (`plan.size` entries in all, compared in `plan.dtype`), and the sample's best
    guess of it in between.

    Without `inside` (the engine's): None for fewer than `tuning.guess` entries (a sample
    would be most of them) or a sample too small to say much; when the number competing is
    not known yet, the sample's share of them stands in for it, and the bounds widen to
    allow for that estimate's error. With `inside` (`total` known): the bounds are values
    of the sample, NaN left out, with how many entries are expected between them (see
    `within`); None for a sample without any.
    """
    now = tuning.get()
    if plan.size < now.guess and not inside:
        return None
    taken = spaced(sources, stride(plan.size, now.sample), plan.dtype, magnitude)
    mine = taken.values
    if group.size > 1:
        here = mine if mine is not None else torch.empty(0, dtype=plan.dtype)
        mine = torch.cat(group.gather(here))
        seen, flagged = (int(v) for v in group.sum(torch.tensor([taken.seen, taken.flagged])))
    else:
        seen, flagged = taken.seen, int(taken.flagged)
    if mine is None:
        return None
    sample = mine
    if inside:
        assert total is not None  # the portable strategy counts first
        return within(sample[sample == sample], count_of(k, total), total)
    size = sample.numel()
    if size < now.sample // 8:
        return None
    if total is None and not flagged:
        total = plan.size
    if total is not None:
        totals = [total]
    else:
        share = size / seen
        error = now.spread * math.sqrt(share * (1 - share) / seen) + 1 / seen
        totals = [max(1, round(plan.size * (share + side * error))) for side in (-1, 1)]
    try:
        shares = [count_of(k, t) / t for t in totals]
    except ValueError:
        return None  # refused for an estimate: the exact count will say
    lower, upper = enclose(sample, shares, floor=0.0 if magnitude else -math.inf)
    if not lower <= upper:
        return None  # NaN in the sample: no guess (scores must be checked, not ranked)
    middle = min(max(round(sum(shares) / len(shares) * size), 1), size)
    mid = min(max(float(sample.kthvalue(middle)[0]), lower), upper)
    return Bounds(lower, mid, upper)


def within(
    sample: Tensor, rank: int, count: int, lo: float | None = None, hi: float | None = None
) -> Bounds | None:
    """Two values of `sample` strictly between lo and hi (None: no bound; NaN never) either
    side of the `rank`-th of the `count` entries there (a `margin` either side), and how
    many entries are expected between them; None if the sample has no value there."""
    sample = sample[in_question(sample, lo, hi)]
    size = sample.numel()
    if not size:
        return None
    share = min(rank / max(count, 1), 1.0)
    a, b = enclose(sample, [share], inside=True)
    low, high = places([share], size)
    low, high = min(max(low, 1), size), min(max(high, 1), size)
    return Bounds(a, a, b, max(high - low, 1) / size * count)


def in_question(values: Tensor, lo: float | None, hi: float | None) -> Tensor:
    """Where `values` (of any framework) lie strictly between lo and hi (None: no bound),
    NaN never."""
    if lo is None:
        return values == values if hi is None else values < hi
    if hi is None:
        return values > lo
    return (values > lo) & (values < hi)


def stride(size: int, count: int) -> int:
    """The spacing of an evenly spaced sample of about `count` of `size` entries: prime to
    2, 3, 5 and 7, so that rows, columns and kernel positions all show up."""
    return coprime(max(1, size // count))


def coprime(step: int) -> int:
    """The first spacing from `step` on that is prime to 2, 3, 5 and 7."""
    while math.gcd(step, 210) != 1:
        step += 1
    return step


def places(shares: Sequence[float], size: int) -> tuple[int, int]:
    """The places (1-based, possibly outside 1..size) in a sorted sample of `size` of two
    bounds that almost surely enclose the entries at `shares` (as shares of all): a
    `margin` below the least, above the greatest."""
    wide = max(margin(share, size) for share in shares)
    return math.floor((min(shares) - wide) * size), math.ceil((max(shares) + wide) * size)


def margin(share: float, size: int) -> float:
    """How far either side of `share` (the k-th entry's expected place, as a share) a
    sample of `size` puts the bounds: `tuning.spread` standard deviations, and 2 entries."""
    return tuning.get().spread * math.sqrt(share * (1 - share) / size) + 2 / size
