"""The pruning methods: Pruning (a criterion times a pattern), the torch-named methods
built from it, Identity and CustomFromMask (their short names: prunekit.whole.registry)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from torch import Tensor, nn

from prunekit.core.amount import (
    Amount,
    validate_dim_type,
    validate_norm_order,
    validate_pruning_amount_init,
)
from prunekit.core.backend import common_namespace
from prunekit.core.checks import check_binary_mask
from prunekit.core.errors import type_error, value_error
from prunekit.core.naming import TensorRef
from prunekit.criteria import Criterion, Magnitude, Random
from prunekit.dropin.base_method import BasePruningMethod
from prunekit.patterns import Channels, Pattern, Unstructured
from prunekit.patterns.pattern import all_ones
from prunekit.patterns.tensorwise import competing_scores

__all__ = [
    "CustomFromMask",
    "Identity",
    "L1Unstructured",
    "LnStructured",
    "Pruning",
    "RandomStructured",
    "RandomUnstructured",
]


class Identity(BasePruningMethod):
    """Prunes nothing: installs the reparameterization with a mask of ones.

    Attributes:
        PRUNING_TYPE: ``"unstructured"``: a later pruning of the same tensor ranks all its
            entries.
    """

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return default_mask

    @classmethod
    def apply(cls, module: nn.Module, name: str) -> BasePruningMethod:  # type: ignore[override]
        """Install a mask of ones on ``module.<name>``."""
        return super().apply(module, name)


class Pruning(BasePruningMethod):
    """Prunes `amount` of a tensor: `criterion` ranks, `pattern` turns scores into a mask.

    ``Pruning(0.5, criterion=MyCriterion())`` prunes the half of the entries MyCriterion
    scores lowest, with the same fast selection as L1Unstructured, in ``apply``, in
    PruningContainer compositions and in global_unstructured (which then ranks all
    tensors together without concatenating them). `amount` is a fraction in [0, 1] or a
    count of units (entries, or channels for Channels).

    Args:
        amount: the share of the tensor to prune, a float in [0, 1], or a count of units (an
            int: entries, or channels under ``Channels``).
        criterion: what ranks the entries (lowest pruned first); ``None`` means
            ``Magnitude()``.
        pattern: how the scores and the amount become a mask; ``None`` means
            ``Unstructured()``.

    Attributes:
        PRUNING_TYPE: the pattern's: how a later pruning of the same tensor in a
            PruningContainer sees what this one left.

    Raises:
        TypeError: `criterion` is not a ``prunekit.Criterion`` or `pattern` not a
            ``prunekit.Pattern``, or `amount` is neither an int nor a float.
        ValueError: `amount` is a negative int or a float outside [0, 1].
    """

    PRUNING_TYPE = "unstructured"  # instances take their pattern's

    def __init__(
        self, amount: float, criterion: Criterion | None = None, pattern: Pattern | None = None
    ) -> None:
        owner = type(self).__name__
        validate_pruning_amount_init(amount, owner=owner)
        criterion = Magnitude() if criterion is None else criterion
        pattern = Unstructured() if pattern is None else pattern
        if not isinstance(criterion, Criterion):
            raise type_error(
                f"{owner}: invalid criterion={criterion!r}; expected a prunekit.Criterion "
                "instance, e.g. prunekit.Magnitude()"
            )
        if not isinstance(pattern, Pattern):
            raise type_error(
                f"{owner}: invalid pattern={pattern!r}; expected a prunekit.Pattern "
                "instance, e.g. prunekit.Unstructured()"
            )
        self.amount = amount
        self.criterion = criterion
        self.pattern = pattern
        self.PRUNING_TYPE = pattern.PRUNING_TYPE
        if isinstance(pattern, Channels):
            self.dim = pattern.dim  # where a container finds the channels' axis

    def _amount(self) -> Amount:
        return Amount(self.amount, type(self).__name__)

    def _own_mask(self) -> bool:
        """False where a subclass computes its masks its own way: the generic paths
        (gathering entries, composing through compute_mask) then serve it."""
        return type(self).compute_mask is Pruning.compute_mask

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return self.pattern.mask(self.criterion, t, default_mask, self._amount())

    def _refuse_unrankable(self, t: Tensor, mask: Tensor, target: TensorRef = None) -> None:
        if self._own_mask():  # refuses, naming the first competing score not finite
            competing_scores(self.criterion, t, target, self._amount().owner, "scores", mask)

    def _compute_mask(self, t: Tensor, default_mask: Tensor, target: TensorRef) -> Tensor:
        if not self._own_mask():
            return self.compute_mask(t, default_mask)
        return self.pattern.mask(self.criterion, t, default_mask, self._amount(), target)

    def _fuses_products(self) -> bool:
        return self.criterion._values_are_scores and self.pattern.fuses_products

    def _choose(
        self,
        scores: Sequence[Tensor],
        masks: Sequence[Tensor | None],
        keep_dtype: Any = None,
        products: Sequence[Tensor | None] | None = None,
        targets: Sequence[TensorRef] | None = None,
    ) -> Iterator[Tensor] | None:
        if not self._own_mask():
            return None
        return self.pattern.select(
            self.criterion, scores, masks, self._amount(), keep_dtype, products, targets
        )

    def _first_mask(self, scores: Tensor, dtype: Any, target: TensorRef = None) -> Tensor | None:
        if not self._own_mask():
            return None
        return self.pattern.first_mask(self.criterion, scores, dtype, self._amount(), target)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(amount={self.amount!r}, criterion={self.criterion!r}, "
            f"pattern={self.pattern!r})"
        )


class RandomUnstructured(Pruning):
    """Prunes `amount` entries chosen uniformly at random (Random x Unstructured).

    Args:
        amount: a fraction of the entries in [0, 1], or a count of them (an int); the same
            rules as ``Pruning``. The draw follows ``torch.manual_seed``.
    """

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: float) -> None:
        super().__init__(amount, Random(), Unstructured())

    @classmethod
    def apply(cls, module: nn.Module, name: str, amount: float) -> BasePruningMethod:  # type: ignore[override]
        """Prune `amount` random entries of ``module.<name>``."""
        return super().apply(module, name, amount=amount)


class L1Unstructured(Pruning):
    """Prunes the `amount` entries of smallest absolute value (Magnitude x Unstructured).

    Args:
        amount: a fraction of the entries in [0, 1], or a count of them (an int).
    """

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: float) -> None:
        super().__init__(amount, Magnitude(), Unstructured())

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: nn.Module,
        name: str,
        amount: float,
        importance_scores: Tensor | None = None,
    ) -> BasePruningMethod:
        """Prune the `amount` entries of ``module.<name>`` with the smallest |score|."""
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)


class RandomStructured(Pruning):
    """Prunes `amount` channels along `dim` chosen uniformly at random (Random x Channels).

    Args:
        amount: a fraction of the channels in [0, 1], or a count of them (an int).
        dim: the axis whose slices are the channels (``0``: the output channels of a Linear
            or Conv weight; ``-1``, the default, the last axis).
    """

    PRUNING_TYPE = "structured"

    def __init__(self, amount: float, dim: int = -1) -> None:
        validate_pruning_amount_init(amount, owner=type(self).__name__)
        dim = validate_dim_type(dim, owner=type(self).__name__)
        super().__init__(amount, Random(), Channels(dim))

    @classmethod
    def apply(  # type: ignore[override]
        cls, module: nn.Module, name: str, amount: float, dim: int = -1
    ) -> BasePruningMethod:
        """Prune `amount` random channels of ``module.<name>`` along `dim`."""
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(Pruning):
    """Prunes the `amount` channels along `dim` with the smallest L`n` norm
    (Magnitude x Channels).

    `n` is a positive number, ``inf``, ``-inf``, ``'fro'`` or ``'nuc'`` (the
    nuclear norm needs a 3-D tensor: two axes besides `dim`). ``'fro'`` works
    on tensors of any rank, as the 2-norm of each channel.

    Args:
        amount: a fraction of the channels in [0, 1], or a count of them (an int).
        n: the norm order that ranks the channels (``1``, ``2``, ``inf``, ``-inf``, ``'fro'``,
            ``'nuc'``).
        dim: the axis whose slices are the channels (``-1`` by default, the last one).

    Attributes:
        n: the norm order, as given.

    Raises:
        TypeError: `dim` is not an int, or `amount` neither an int nor a float.
        ValueError: `n` is not a norm order torch accepts, or `amount` is out of range.
    """

    PRUNING_TYPE = "structured"

    def __init__(self, amount: float, n: float | str, dim: int = -1) -> None:
        owner = type(self).__name__
        validate_pruning_amount_init(amount, owner=owner)
        dim = validate_dim_type(dim, owner=owner)
        validate_norm_order(n, owner=owner)
        super().__init__(amount, Magnitude(), Channels(dim, n))
        self.n = n

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: nn.Module,
        name: str,
        amount: float,
        n: float | str,
        dim: int,
        importance_scores: Tensor | None = None,
    ) -> BasePruningMethod:
        """Prune the `amount` channels of ``module.<name>`` with the smallest L`n` norm."""
        return super().apply(
            module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores
        )


class CustomFromMask(BasePruningMethod):
    """Prunes the entries where a given mask of 0s and 1s holds 0.

    Args:
        mask: a tensor of the pruned tensor's shape, holding only 0 and 1 (or a bool
            tensor); it is checked here and against the tensor's shape when applied.

    Attributes:
        mask: the mask as given (not copied).
    """

    PRUNING_TYPE = "global"

    def __init__(self, mask: Tensor) -> None:
        if not str(getattr(mask, "dtype", "")).endswith("bool"):  # bool masks are binary
            check_binary_mask(mask, "CustomFromMask")
        self.mask = mask

    _owned = False

    @classmethod
    def _trusted(cls, mask: Tensor) -> CustomFromMask:
        """One for a mask prunekit made (binary, used nowhere else): no check, no copy."""
        method = cls.__new__(cls)
        method.mask = mask
        method._owned = True
        return method

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        common_namespace("CustomFromMask", mask=self.mask, default_mask=default_mask)
        if tuple(self.mask.shape) != tuple(default_mask.shape):
            raise value_error(
                f"CustomFromMask: the mask has shape {tuple(self.mask.shape)}; "
                f"expected the tensor's shape {tuple(default_mask.shape)}"
            )
        kept: Tensor = self.mask.to(dtype=default_mask.dtype, device=default_mask.device)
        if not all_ones(default_mask):
            return default_mask * kept
        return kept.clone() if kept is self.mask and not self._owned else kept

    def _first_mask(self, scores: Tensor, dtype: Any, target: TensorRef = None) -> Tensor | None:
        if not self._owned or self.mask.dtype != dtype:
            return None
        if tuple(self.mask.shape) != tuple(scores.shape):
            return None  # compute_mask explains the mismatch
        return self.mask

    @classmethod
    def apply(cls, module: nn.Module, name: str, mask: Tensor) -> BasePruningMethod:  # type: ignore[override]
        """Prune ``module.<name>`` where `mask` is 0."""
        return super().apply(module, name, mask=mask)
