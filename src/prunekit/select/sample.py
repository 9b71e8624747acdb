"""The sampled guess: magnitudes that almost surely enclose the k-th smallest, and a best guess.

An evenly spaced sample of `tuning.sample` magnitudes, its spacing prime to 2,
3, 5 and 7 so that rows, columns and kernel positions all show up, gives the
bounds from its order statistics, `tuning.spread` standard deviations either
side of the k-th one's expected place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from prunekit.select import tuning
from prunekit.select.chunks import Chunks
from prunekit.select.sources import Count, resolve

__all__ = ["coprime", "guess", "margin", "places", "stride"]


def guess(chunks: Chunks, k: Count, total: int | None) -> tuple[Tensor, Tensor, Tensor] | None:
    """(lower, mid, upper): magnitudes that very likely enclose the k-th smallest, from an
    evenly spaced sample, and the sample's best guess of it in between.

    None for fewer than `tuning.guess` entries (a sample would be most of them) or a
    sample too small to say much. When the number competing is not known yet, the
    sample's share of them stands in for it, and the bounds widen to allow for that
    estimate's error.
    """
    plan = chunks.plan
    now = tuning.get()
    if plan.size < now.guess:
        return None
    step = stride(plan.size, now.sample)
    parts = []
    flagged = False
    seen = 0  # entries sampled, competing or not
    for source in chunks.sources:
        scores, alive = source()
        part = scores.detach().reshape(-1)[::step].to(plan.dtype).abs()
        seen += part.numel()
        if alive is not None:
            part = part[alive.reshape(-1)[::step] == 1]
            flagged = True
        parts.append(part)
    sample = torch.cat(parts)  # a sample: at most 1/stride of the entries
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
        shares = [resolve(k, t) / t for t in totals]
    except ValueError:
        return None  # refused for an estimate: the exact count will say
    low, high = places(shares, size)
    middle = min(max(round(sum(shares) / len(shares) * size), 1), size)
    zero = torch.zeros((), dtype=plan.dtype)
    lower = sample.kthvalue(low)[0] if low >= 1 else zero
    upper = sample.kthvalue(high)[0] if high <= size else zero + math.inf
    mid = sample.kthvalue(middle)[0].clamp(lower, upper)
    if not bool(lower <= upper):
        return None  # NaN in the sample: no guess (scores must be checked, not ranked)
    return lower, mid, upper


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
