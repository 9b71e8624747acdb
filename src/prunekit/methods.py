"""The built-in pruning methods: each a PRUNING_TYPE, its parameters and compute_mask()."""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor, nn

from prunekit._backend import common_namespace, namespace, norm
from prunekit.amount import (
    compute_nparams_to_prune,
    validate_dim,
    validate_norm_order,
    validate_pruning_amount,
    validate_pruning_amount_init,
    validate_structured_tensor,
)
from prunekit.base import BasePruningMethod
from prunekit.checks import check_binary_mask, check_finite
from prunekit.select import smallest_k

__all__ = [
    "CustomFromMask",
    "Identity",
    "L1Unstructured",
    "LnStructured",
    "RandomStructured",
    "RandomUnstructured",
]


class Identity(BasePruningMethod):
    """Prunes nothing: installs the reparameterization with a mask of ones."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return default_mask

    @classmethod
    def apply(cls, module: nn.Module, name: str) -> BasePruningMethod:  # type: ignore[override]
        """Install a mask of ones on ``module.<name>``."""
        return super().apply(module, name)


class _AmountMethod(BasePruningMethod):
    """Shared constructor of the methods that prune an `amount` of units."""

    def __init__(self, amount: float) -> None:
        validate_pruning_amount_init(amount, owner=type(self).__name__)
        self.amount = amount

    def _count(self, units: int) -> int:
        """How many of `units` to prune; raises if a count exceeds them."""
        validate_pruning_amount(self.amount, units, owner=type(self).__name__)
        return compute_nparams_to_prune(self.amount, units)


class _Unstructured(_AmountMethod):
    """Prunes the `amount` entries with the smallest scores (see _scores)."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        k = self._count(t.numel())
        mask = default_mask.clone()
        if k:
            mask.masked_fill_(smallest_k(self._scores(t), k), 0)
        return mask

    def _scores(self, t: Tensor) -> Tensor:
        raise NotImplementedError


class RandomUnstructured(_Unstructured):
    """Prunes `amount` entries chosen uniformly at random."""

    def _scores(self, t: Tensor) -> Tensor:
        noise: Tensor = namespace(t).rand(t.shape, device=t.device)
        return noise

    @classmethod
    def apply(cls, module: nn.Module, name: str, amount: float) -> BasePruningMethod:  # type: ignore[override]
        """Prune `amount` random entries of ``module.<name>``."""
        return super().apply(module, name, amount=amount)


class L1Unstructured(_Unstructured):
    """Prunes the `amount` entries of smallest absolute value."""

    def _scores(self, t: Tensor) -> Tensor:
        _require_finite(t, type(self).__name__)
        return t.abs()

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


class _Structured(_AmountMethod):
    """Prunes whole channels along `dim`: the `amount` with the smallest scores."""

    PRUNING_TYPE = "structured"

    def __init__(self, amount: float, dim: int = -1) -> None:
        super().__init__(amount)
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"{type(self).__name__}: invalid dim={dim!r}; expected an int")
        self.dim = dim

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        owner = type(self).__name__
        validate_structured_tensor(tuple(t.shape), owner)
        dim = validate_dim(self.dim, t.dim(), owner)
        k = self._count(t.shape[dim])
        if k == 0:
            return default_mask
        pruned = smallest_k(self._channel_scores(t, dim), k)
        shape = [1] * t.dim()
        shape[dim] = t.shape[dim]
        return default_mask * (~pruned).reshape(shape).to(dtype=default_mask.dtype)

    def _channel_scores(self, t: Tensor, dim: int) -> Tensor:
        raise NotImplementedError


class RandomStructured(_Structured):
    """Prunes `amount` channels along `dim` chosen uniformly at random."""

    def _channel_scores(self, t: Tensor, dim: int) -> Tensor:
        noise: Tensor = namespace(t).rand(t.shape[dim], device=t.device)
        return noise

    @classmethod
    def apply(  # type: ignore[override]
        cls, module: nn.Module, name: str, amount: float, dim: int = -1
    ) -> BasePruningMethod:
        """Prune `amount` random channels of ``module.<name>`` along `dim`."""
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(_Structured):
    """Prunes the `amount` channels along `dim` with the smallest L`n` norm.

    `n` is a positive number, ``inf``, ``-inf``, ``'fro'`` or ``'nuc'`` (the
    nuclear norm needs a 3-D tensor: two axes besides `dim`). ``'fro'`` works
    on tensors of any rank, as the 2-norm of each channel.
    """

    def __init__(self, amount: float, n: Any, dim: int = -1) -> None:
        super().__init__(amount, dim)
        validate_norm_order(n, owner=type(self).__name__)
        self.n = n

    def _channel_scores(self, t: Tensor, dim: int) -> Tensor:
        owner = type(self).__name__
        others = [d for d in range(t.dim()) if d != dim]
        if self.n == "nuc" and len(others) != 2:
            raise ValueError(
                f"{owner}: n='nuc' needs a 3-D tensor (two axes besides dim), "
                f"got shape {tuple(t.shape)}"
            )
        norms = norm(t, self.n, others)
        _require_finite(norms, owner, what="channel norms")
        return norms

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: nn.Module,
        name: str,
        amount: float,
        n: Any,
        dim: int,
        importance_scores: Tensor | None = None,
    ) -> BasePruningMethod:
        """Prune the `amount` channels of ``module.<name>`` with the smallest L`n` norm."""
        return super().apply(
            module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores
        )


class CustomFromMask(BasePruningMethod):
    """Prunes the entries where a given mask of 0s and 1s holds 0."""

    PRUNING_TYPE = "global"

    def __init__(self, mask: Tensor) -> None:
        check_binary_mask(mask, "CustomFromMask")
        self.mask = mask

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        common_namespace("CustomFromMask", mask=self.mask, default_mask=default_mask)
        if tuple(self.mask.shape) != tuple(default_mask.shape):
            raise ValueError(
                f"CustomFromMask: the mask has shape {tuple(self.mask.shape)}; "
                f"expected the tensor's shape {tuple(default_mask.shape)}"
            )
        result: Tensor = default_mask * self.mask.to(
            dtype=default_mask.dtype, device=default_mask.device
        )
        return result

    @classmethod
    def apply(cls, module: nn.Module, name: str, mask: Tensor) -> BasePruningMethod:  # type: ignore[override]
        """Prune ``module.<name>`` where `mask` is 0."""
        return super().apply(module, name, mask=mask)


def _require_finite(t: Tensor, owner: str, what: str = "scores") -> None:
    """Raise ValueError if `t` holds NaN or infinity: such values cannot be ranked."""
    if t.numel() == 0 or math.isfinite(float(t.sum())):
        return
    check_finite(t, owner, what)
