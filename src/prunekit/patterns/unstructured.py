"""Unstructured: the k entries with the smallest scores, of one tensor or of many at once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from prunekit.core.amount import Amount
from prunekit.core.backend import multiply_, namespace
from prunekit.core.checks import check_finite
from prunekit.core.errors import value_error
from prunekit.core.naming import TensorRef
from prunekit.patterns.pattern import Pattern, all_ones
from prunekit.select import NotFinite, alive_count, smallest_k_many

if TYPE_CHECKING:  # a pattern ranks by a criterion: criteria stand above patterns
    from prunekit.criteria.criterion import Criterion
    from prunekit.criteria.random import Random

__all__ = ["Unstructured"]


class Unstructured(Pattern):
    """Prunes the `amount` entries with the smallest scores.

    Several tensors rank together as if concatenated, without being concatenated: the
    selection reads them chunk by chunk (global pruning). Ties go to the earlier tensor,
    then the lower flat index.

    Attributes:
        PRUNING_TYPE: ``"unstructured"``: a later pruning ranks the entries still unpruned.
        fuses_products: True: scores x mask are written in the selection's own pass.
    """

    PRUNING_TYPE = "unstructured"
    fuses_products = True

    def mask(
        self,
        criterion: Criterion,
        t: Tensor,
        default_mask: Tensor,
        amount: Amount,
        target: TensorRef = None,
    ) -> Tensor:
        kept = self.select(criterion, [t], [None], amount, default_mask.dtype, targets=[target])
        if kept is None:  # the criterion's scores, which may not be finite where `t` is
            scores = t if criterion._values_are_scores else criterion._checked_scores(t, target)
            raise unrankable(scores, amount.owner, "scores")
        mask = next(kept).reshape(t.shape)
        if not all_ones(default_mask):
            multiply_(mask, default_mask)
        return mask

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
        """None when some scores cannot be ranked (NaN or infinity)."""
        if criterion._compact:  # Random's draws: made in the mask's shape at once
            assert products is None  # its scores are noise, not the tensor's values
            return _random(cast("Random", criterion), values, masks, amount, keep_dtype)
        where = targets or [None] * len(values)
        sources = [
            criterion._source(t, m, tg) for t, m, tg in zip(values, masks, where, strict=True)
        ]
        # With no masks every entry competes; with masks the selection counts those that
        # compete as it reads them. It checks the scores are finite (in its one pass when
        # it can), after the amount.
        everything = all(m is None for m in masks)
        try:
            return smallest_k_many(
                sources,
                amount.count,
                magnitude=criterion.by_magnitude,
                keep_dtype=keep_dtype,
                total=sum(t.numel() for t in values) if everything else None,
                finite=True,
                products=products,
            )
        except NotFinite:
            return None

    def __repr__(self) -> str:
        return "Unstructured()"


def _random(
    criterion: Random,
    values: Sequence[Tensor],
    masks: Sequence[Tensor | None],
    amount: Amount,
    keep_dtype: Any,
) -> Iterator[Tensor]:
    """Noise for the competing entries only, ranked, then put back in place."""
    counts = [alive_count(t, m) for t, m in zip(values, masks, strict=True)]
    k = amount.count(sum(counts))  # before any draw: a bad amount consumes no randomness
    sources = criterion._compact_sources(values, counts)
    if all(m is None for m in masks):
        return smallest_k_many(sources, k, magnitude=True, keep_dtype=keep_dtype, total=sum(counts))
    chosen = smallest_k_many(sources, k, magnitude=True, total=sum(counts))
    spread = (_spread(pick, t, m) for pick, t, m in zip(chosen, values, masks, strict=True))
    if keep_dtype is None:
        return spread
    return ((~pick).to(keep_dtype) for pick in spread)


def _spread(chosen: Tensor, t: Tensor, alive: Tensor | None) -> Tensor:
    """A selection made among the alive entries, put back at their places in `t`."""
    if alive is None:
        return chosen
    ns = namespace(t)
    full: Tensor = ns.zeros(t.numel(), dtype=ns.bool, device=t.device)
    return full.masked_scatter_(alive.reshape(-1) == 1, chosen)


def unrankable(t: Tensor, owner: str, what: str) -> ValueError:
    """The error for scores holding NaN or infinity (check_finite names the first one)."""
    check_finite(t, owner, what)
    return value_error(
        f"{owner}: the {what} hold NaN or infinity, which cannot be ranked; expected finite {what}"
    )
