"""Channels: whole slices along one dim (output rows, filters), ranked by a norm of their
entries' scores."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from prunekit.core.amount import (
    Amount,
    validate_dim,
    validate_dim_type,
    validate_norm_order,
    validate_structured_tensor,
)
from prunekit.core.backend import is_tensor, namespace, norm
from prunekit.core.errors import type_error, value_error
from prunekit.core.naming import TensorRef
from prunekit.patterns.pattern import Pattern, all_ones
from prunekit.patterns.unstructured import unrankable
from prunekit.select import all_finite, smallest_k

if TYPE_CHECKING:  # a pattern ranks by a criterion: criteria stand above patterns
    from prunekit.criteria.criterion import Criterion

__all__ = ["Channels"]


class Channels(Pattern):
    """Prunes the `amount` channels along `dim` with the smallest scores.

    A channel's score is the criterion's own (Random draws one per channel) or the
    L`norm` norm of its entries' scores: `norm` is a positive number, ``inf``, ``-inf``,
    ``'fro'`` (the 2-norm, any rank) or ``'nuc'`` (the nuclear norm: two axes besides
    `dim`).

    Args:
        dim: the axis whose slices are the channels (``0``: a Linear's or convolution's output
            channels; the default ``-1``, the last axis).
        norm: the norm order that reduces a channel's entry scores to one score (2 by
            default).

    Raises:
        TypeError: `dim` is not an int.
        ValueError: `norm` is not a norm order torch accepts.
    """

    PRUNING_TYPE = "structured"

    def __init__(self, dim: int = -1, norm: float | str = 2) -> None:
        self.dim = validate_dim_type(dim, owner="Channels")
        validate_norm_order(norm, owner="Channels")
        self.norm = norm

    def mask(
        self,
        criterion: Criterion,
        t: Tensor,
        default_mask: Tensor,
        amount: Amount,
        target: TensorRef = None,
    ) -> Tensor:
        kept = self._kept(criterion, t, default_mask.dtype, amount, target)
        if kept is None:
            return default_mask
        if all_ones(default_mask):
            return kept.expand(default_mask.shape).contiguous()  # a write, without a read
        return default_mask * kept

    def first_mask(
        self,
        criterion: Criterion,
        t: Tensor,
        dtype: torch.dtype,
        amount: Amount,
        target: TensorRef = None,
    ) -> Tensor | None:
        kept = self._kept(criterion, t, dtype, amount, target)
        if kept is None:
            ones: Tensor = namespace(t).ones(t.shape, dtype=dtype, device=t.device)
            return ones
        return kept.expand(t.shape).contiguous()

    def _kept(
        self, criterion: Criterion, t: Tensor, dtype: torch.dtype, amount: Amount, target: TensorRef
    ) -> Tensor | None:
        """1 (kept) or 0 per channel in `dtype`, shaped to broadcast; None if none is pruned."""
        validate_structured_tensor(tuple(t.shape), amount.owner)
        dim = validate_dim(self.dim, t.dim(), amount.owner)
        k = amount.count(t.shape[dim])
        if k == 0:
            return None
        pruned = smallest_k(self._channel_scores(criterion, t, dim, amount.owner, target), k)
        shape = [1] * t.dim()
        shape[dim] = t.shape[dim]
        kept: Tensor = (~pruned).reshape(shape).to(dtype=dtype)
        return kept

    def _channel_scores(
        self, criterion: Criterion, t: Tensor, dim: int, owner: str, target: TensorRef
    ) -> Tensor:
        own = criterion.channel_scores(t, dim, target)
        if own is not None:
            return _checked_own(own, criterion, t, dim, owner)
        others = [d for d in range(t.dim()) if d != dim]
        if self.norm == "nuc" and len(others) != 2:
            raise value_error(
                f"{owner}: n='nuc' needs a 3-D tensor (two axes besides dim), "
                f"got shape {tuple(t.shape)}"
            )
        scores = t if criterion._values_are_scores else criterion._checked_scores(t, target)
        if not scores.is_floating_point():  # integer importance scores: norms are floats
            scores = scores.to(dtype=namespace(scores).float64)
        norms = norm(scores, self.norm, others)
        if not all_finite(norms) and all_finite(scores):  # past a 16-bit float's range
            norms = norm(scores.to(dtype=namespace(scores).float64), self.norm, others)
        if not all_finite(norms):
            raise unrankable(norms, owner, "channel norms")
        return norms

    def __repr__(self) -> str:
        return f"Channels(dim={self.dim}, norm={self.norm!r})"


def _checked_own(own: object, criterion: Criterion, t: Tensor, dim: int, owner: str) -> Tensor:
    """A criterion's own channel scores, refused unless one finite score per channel along
    `dim` (as its entries' scores are checked: ``Criterion._checked_scores``)."""
    name = f"{type(criterion).__name__}.channel_scores"
    if not is_tensor(own):
        raise type_error(
            f"{owner}: {name} returned {type(own).__name__}; expected a 1-D tensor of one "
            f"score per channel along dim {dim}"
        )
    scores = cast(Tensor, own)
    expected = (t.shape[dim],)
    if tuple(scores.shape) != expected:
        raise value_error(
            f"{owner}: {name} returned shape {tuple(scores.shape)}; expected {expected}, one "
            f"score per channel along dim {dim} of the tensor of shape {tuple(t.shape)}"
        )
    if not all_finite(scores):
        raise unrankable(scores, owner, f"channel scores of {type(criterion).__name__}")
    return scores
