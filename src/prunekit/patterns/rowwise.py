"""Exact k-smallest selection along the rows of a score matrix (the kernel of PerRow and NM).

Each row of `scores` (shape rows x cols) loses its `k[r]` smallest entries; among equal
scores the lower column goes first, so every input gives one mask. The k-th smallest value
of a row is found with ``kthvalue`` (``sort`` where rows need different counts), then
entries below it are chosen and the ties at it are filled in column order. Rows are read
a block at a time, so the work memory stays a few bytes per entry of one block.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from torch import Tensor

from prunekit.core.amount import Amount
from prunekit.core.backend import namespace
from prunekit.core.checks import check_finite
from prunekit.core.errors import value_error
from prunekit.core.method import TensorRef
from prunekit.patterns.base import Pattern, all_ones

if TYPE_CHECKING:  # a pattern ranks by a criterion: criteria stand above patterns
    from prunekit.criteria.base import Criterion

__all__ = ["RowwisePattern", "competing_scores", "smallest_per_row"]

_BLOCK = 1 << 22  # entries ranked at a time


class RowwisePattern(Pattern):
    """A pattern whose masks are made tensor by tensor by ``_keep`` (PerRow, NM): the
    mask and the joint selection around it are the same for every such pattern."""

    def _keep(
        self,
        criterion: Criterion,
        t: Tensor,
        mask: Tensor | None,
        amount: Amount,
        target: TensorRef,
    ) -> Tensor:
        """A bool tensor shaped like `t`: False where this pruning prunes (entries pruned
        before read True: the old `mask` keeps them at 0)."""
        raise NotImplementedError

    def mask(
        self,
        criterion: Criterion,
        t: Tensor,
        default_mask: Tensor,
        amount: Amount,
        target: TensorRef = None,
    ) -> Tensor:
        alive = None if all_ones(default_mask) else default_mask
        keep = self._keep(criterion, t, alive, amount, target).to(dtype=default_mask.dtype)
        return keep if alive is None else keep * default_mask

    def select(
        self,
        criterion: Criterion,
        values: Sequence[Tensor],
        masks: Sequence[Tensor | None],
        amount: Amount,
        keep_dtype: Any = None,
        products: Sequence[Tensor | None] | None = None,
        targets: Sequence[TensorRef] | None = None,
    ) -> Iterator[Tensor] | None:
        """One flat selection per tensor (each tensor's rows or groups are its own): True
        where pruned now, or with `keep_dtype` 1s (kept, or pruned before) and 0s (pruned now)."""
        where = targets or [None] * len(values)
        # Every tensor is ranked (and checked) before the first selection is handed out.
        kept = [
            self._keep(criterion, t, m, amount, tg)
            for t, m, tg in zip(values, masks, where, strict=True)
        ]
        if keep_dtype is None:
            chosen = [
                ~k if m is None else (~k) & (m.reshape(k.shape) == 1)
                for k, m in zip(kept, masks, strict=True)
            ]
            return (c.reshape(-1) for c in chosen)
        return (k.reshape(-1).to(dtype=keep_dtype) for k in kept)


def competing_scores(
    criterion: Criterion, t: Tensor, target: TensorRef, owner: str, what: str
) -> Tensor:
    """The criterion's scores for `t`, as ranked (magnitudes where it ranks by them)."""
    given = t if criterion._values_are_scores else criterion._checked_scores(t, target)
    scores = given.detach()
    if criterion.by_magnitude:
        scores = scores.abs()
    low, high = namespace(scores).aminmax(scores) if scores.numel() else (0.0, 0.0)
    if not (math.isfinite(float(low)) and math.isfinite(float(high))):
        check_finite(given, owner, what)  # names how many, the first and where
        raise value_error(
            f"{owner}: the {what} hold NaN or infinity, which cannot be ranked; "
            "expected finite scores"
        )
    return scores


def smallest_per_row(scores: Tensor, k: Tensor | int, alive: Tensor | None) -> Tensor:
    """A bool matrix shaped like `scores`: True at each row's `k` smallest competing entries.

    `alive` (bool, same shape, or None for all) says which entries compete; `k` is one
    count for every row or one per row (each at most its row's competing entries).
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
