"""The Pattern protocol: a criterion's scores and an amount in, a mask out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from prunekit.core.amount import Amount
from prunekit.core.backend import namespace
from prunekit.core.naming import TensorRef

if TYPE_CHECKING:  # a pattern ranks by a criterion: criteria stand above patterns
    from prunekit.criteria.criterion import Criterion

__all__ = ["Pattern", "all_ones"]


class Pattern(ABC):
    """Turns a criterion's scores and an amount into a mask of 0s and 1s.

    PRUNING_TYPE says how a later pruning composes with this one's mask (see
    PruningContainer): 'unstructured' patterns rank the entries still unpruned,
    'structured' ones (with a ``dim``) the channels not yet fully pruned.

    Attributes:
        PRUNING_TYPE: ``"unstructured"`` or ``"structured"``, set by each subclass; a
            ``Pruning`` with this pattern takes it as its own.
        fuses_products: whether ``select`` can write scores x mask in its own pass.
    """

    PRUNING_TYPE: ClassVar[str]
    fuses_products: ClassVar[bool] = False
    """Whether select() can write scores x mask in its own pass (``products``)."""

    @abstractmethod
    def mask(
        self,
        criterion: Criterion,
        t: Tensor,
        default_mask: Tensor,
        amount: Amount,
        target: TensorRef = None,
    ) -> Tensor:
        """The mask for `t` (the tensor or its importance scores), in the dtype of
        `default_mask`; entries zero there stay zero.

        Args:
            criterion: what scores the entries of `t`.
            t: the tensor's values, or the importance scores given for it.
            default_mask: the mask so far, shaped like `t` (ones for a tensor not pruned).
            amount: the amount to prune and the name its errors go by.
            target: the tensor's ``(module, name)`` where known, for criteria that keep
                statistics per module.

        Returns:
            A mask of 0s and 1s shaped like `t`.
        """

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
        """Masks for several tensors ranked jointly (see BasePruningMethod._choose), or
        None where the pattern has no joint selection.

        Args:
            criterion: what scores the entries.
            values: the tensors (or their importance scores), ranked together.
            masks: each tensor's mask so far, or None where it is not pruned yet.
            amount: the amount to prune over all of them.
            keep_dtype: None: flat bool selections, True where pruned; a dtype: flat 0/1
                masks of that dtype, 1 where kept.
            products: where given, a flat tensor per input into which value x mask is
                written in the same pass (``fuses_products`` patterns only).
            targets: each tensor's ``(module, name)`` where known.

        Returns:
            One flat selection per tensor, in their order, ranked together as if
            concatenated and made as the iterator is read; None (the default) when the
            pattern has no joint selection.
        """
        return None

    def first_mask(
        self,
        criterion: Criterion,
        t: Tensor,
        dtype: torch.dtype,
        amount: Amount,
        target: TensorRef = None,
    ) -> Tensor | None:
        """``mask(criterion, t, ones)`` in `dtype` without building the ones; None where
        the pattern has no such shortcut.

        Args:
            criterion: what scores the entries of `t`.
            t: the tensor's values, or the importance scores given for it.
            dtype: the dtype of the mask.
            amount: the amount to prune.
            target: the tensor's ``(module, name)`` where known.

        Returns:
            The mask, or None where the pattern has no shortcut.
        """
        kept = self.select(criterion, [t], [None], amount, keep_dtype=dtype, targets=[target])
        return None if kept is None else next(kept).reshape(t.shape)


def all_ones(mask: Tensor) -> bool:
    """Whether every entry of `mask` is 1 (then it need not be multiplied in)."""
    low, high = namespace(mask).aminmax(mask) if mask.numel() else (1, 1)
    return bool(low == 1) and bool(high == 1)
