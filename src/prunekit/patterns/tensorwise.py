"""What PerRow and NM share: masks made tensor by tensor (RowwisePattern), and the scores
they rank (competing_scores); the ranking itself is prunekit.select.rows's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from prunekit.core.amount import Amount
from prunekit.core.backend import namespace
from prunekit.core.checks import check_finite
from prunekit.core.errors import value_error
from prunekit.core.naming import TensorRef
from prunekit.patterns.pattern import Pattern, all_ones

if TYPE_CHECKING:  # a pattern ranks by a criterion: criteria stand above patterns
    from prunekit.criteria.criterion import Criterion

__all__ = ["RowwisePattern", "competing_scores"]


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
        keep_dtype: torch.dtype | None = None,
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
    criterion: Criterion,
    t: Tensor,
    target: TensorRef,
    owner: str,
    what: str,
    mask: Tensor | None = None,
) -> Tensor:
    """The criterion's scores for `t`, as ranked (magnitudes where it ranks by them), finite
    where they compete: where `mask` (the tensor's mask so far, None: all) is 1. Entries
    pruned before do not compete, so NaN or infinity there is left (as Unstructured does).
    Integer scores are ranked as float64 (as Channels takes their norms)."""
    given = t if criterion._values_are_scores else criterion._checked_scores(t, target)
    scores = given.detach()
    if criterion.by_magnitude:
        scores = scores.abs()
    if not scores.is_floating_point():  # integer importance scores: the entries pruned
        scores = scores.to(dtype=namespace(scores).float64)  # before are set apart as +inf
    competing = scores if mask is None else scores.masked_fill(mask.reshape(t.shape) != 1, 0)
    low, high = namespace(scores).aminmax(competing) if scores.numel() else (0.0, 0.0)
    if not (math.isfinite(float(low)) and math.isfinite(float(high))):
        named = given if mask is None else given.masked_fill(mask.reshape(t.shape) != 1, 0)
        check_finite(named, owner, what)  # names how many, the first and where
        raise value_error(
            f"{owner}: the {what} hold NaN or infinity, which cannot be ranked; "
            "expected finite scores"
        )
    return scores
