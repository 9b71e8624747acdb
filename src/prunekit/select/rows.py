"""The k smallest entries of each row of a score matrix (PerRow, NM and SparseGPT rank here).

Each row of `scores` (shape rows x cols) loses its `k[r]` smallest competing entries; among
equal scores the lower column goes first, the tie rule of every selection (see ties.py).
The k-th smallest value of a row is found with ``topk`` (``sort`` where rows need different
counts), then entries below it are chosen and the ties at it are filled in column order.
Rows are read a block at a time, so the work memory stays a few bytes per entry of one
block. Short rows of one count (NM's groups of 4 or 8) are ranked by pairwise comparisons
instead, with the same result.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from prunekit.core.backend import namespace

__all__ = ["smallest_in_short_rows", "smallest_per_row"]

_BLOCK = 1 << 22  # entries ranked at a time


def smallest_per_row(scores: Tensor, k: Tensor | int, alive: Tensor | None) -> Tensor:
    """A bool matrix shaped like `scores`: True at each row's `k` smallest competing entries.

    Args:
        scores: a matrix of finite scores (torch, or any framework core.backend serves).
        k: one count for every row, or one per row (each at most its row's competing
            entries).
        alive: bool, shaped like `scores`: the entries that compete (None: all of them).

    Returns:
        The chosen entries, ties at each row's k-th value to the lower columns.
    """
    ns = namespace(scores)
    rows, cols = scores.shape
    if rows == 0 or cols == 0:
        none: Tensor = ns.zeros((rows, cols), dtype=ns.bool, device=scores.device)
        return none
    step = max(1, _BLOCK // cols)
    if step >= rows:
        return _block(ns, scores, k, alive)
    out: Tensor = ns.empty((rows, cols), dtype=ns.bool, device=scores.device)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        part_k = k if isinstance(k, int) else k[start:stop]
        part_alive = None if alive is None else alive[start:stop]
        out[start:stop] = _block(ns, scores[start:stop], part_k, part_alive)
    return out


def _block(ns: Any, scores: Tensor, k: Tensor | int, alive: Tensor | None) -> Tensor:
    if alive is not None:
        scores = scores.masked_fill(~alive, float("inf"))  # never below a competing k-th
    if isinstance(k, int):
        if k == 0:
            none: Tensor = ns.zeros(scores.shape, dtype=ns.bool, device=scores.device)
            return none
        # The k-th smallest of each row: the largest of its k smallest (topk is the
        # quickest way there, but orders ties arbitrarily, so only its value is used).
        kth = scores.topk(k, dim=1, largest=False, sorted=False)[0].amax(dim=1, keepdim=True)
    else:
        k = k.reshape(-1, 1)
        ordered = scores.sort(dim=1)[0]
        kth = ordered.gather(1, (k - 1).clamp(min=0))
        kth = kth.masked_fill(k == 0, -float("inf"))  # nothing is below -inf
    upto = scores <= kth
    # Each row has at least k entries up to its k-th value: equal totals mean exactly k each.
    wanted = k * scores.shape[0] if isinstance(k, int) else int(k.sum())
    if int(upto.count_nonzero()) == wanted:
        return upto  # no row has more than one entry at its k-th value
    below = scores < kth
    at = upto & ~below
    need = k - below.sum(dim=1, keepdim=True)
    chosen: Tensor = below | (at & (at.to(ns.int32).cumsum(dim=1) <= need))
    return chosen


def smallest_in_short_rows(groups: Tensor, k: int) -> Tensor:
    """``smallest_per_row(groups, k, None)`` for short rows of a torch matrix, quicker.

    An entry is among its row's k smallest when fewer than k entries come before it in the
    row's stable order (smaller, or equal and in a lower column). Each pair of columns is
    compared once (m * (m - 1) / 2 comparisons, read in place as strided columns: no
    transposed copy), the result counted for both: elementwise work, about 5x quicker than
    a per-row top-k of 4 entries.

    Args:
        groups: a torch matrix of finite scores, rows x m (m at most 255).
        k: how many entries each row loses.

    Returns:
        A bool matrix shaped like `groups`: True at each row's k smallest.
    """
    rows, m = groups.shape
    columns = groups.unbind(1)
    before = [torch.zeros(rows, dtype=torch.uint8, device=groups.device) for _ in range(m)]
    for i in range(m):
        for j in range(i + 1, m):
            first = columns[i] <= columns[j]  # column i comes before column j
            before[j] += first
            before[i] += ~first
    chosen = torch.empty((rows, m), dtype=torch.bool, device=groups.device)
    for i in range(m):
        torch.lt(before[i], k, out=chosen[:, i])
    return chosen
