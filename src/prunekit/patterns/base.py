"""The Pattern protocol: a criterion's scores and an amount in, a mask out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from prunekit.core.amount import Amount
from prunekit.core.backend import namespace
from prunekit.core.method import TensorRef

if TYPE_CHECKING:  # a pattern ranks by a criterion: criteria stand above patterns
    from prunekit.criteria.base import Criterion

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
        `default_mask`; entries zero there stay zero."""

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
        """Masks for several tensors ranked jointly (see BasePruningMethod._choose), or
        None where the pattern has no joint selection."""
        return None

    def first_mask(
        self, criterion: Criterion, t: Tensor, dtype: Any, amount: Amount, target: TensorRef = None
    ) -> Tensor | None:
        """``mask(criterion, t, ones)`` in `dtype` without building the ones; None where
        the pattern has no such shortcut."""
        kept = self.select(criterion, [t], [None], amount, keep_dtype=dtype, targets=[target])
        return None if kept is None else next(kept).reshape(t.shape)


def all_ones(mask: Tensor) -> bool:
    """Whether every entry of `mask` is 1 (then it need not be multiplied in)."""
    low, high = namespace(mask).aminmax(mask) if mask.numel() else (1, 1)
    return bool(low == 1) and bool(high == 1)
