"""The built-in pruning methods: each a PRUNING_TYPE, its parameters and compute_mask()."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

from torch import Tensor, nn

from prunekit.core.amount import (
    compute_nparams_to_prune,
    validate_dim,
    validate_dim_type,
    validate_norm_order,
    validate_pruning_amount,
    validate_pruning_amount_init,
    validate_structured_tensor,
)
from prunekit.core.backend import common_namespace, multiply_, namespace, norm, seeded_rand
from prunekit.core.checks import check_binary_mask, check_finite
from prunekit.core.method import BasePruningMethod
from prunekit.select import (
    NotFinite,
    Source,
    alive_count,
    all_finite,
    smallest_k,
    smallest_k_many,
)

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
    """Prunes the `amount` entries with the smallest scores (see _rank)."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        kept = self._rank([t], [_no_flags], self._count, default_mask.dtype)
        if kept is None:
            raise _unrankable(t, type(self).__name__, "scores")
        mask = next(kept).reshape(t.shape)
        if not _all_ones(default_mask):
            multiply_(mask, default_mask)
        return mask

    def _choose(
        self,
        scores: Sequence[Tensor],
        masks: Sequence[Tensor | None],
        keep_dtype: Any = None,
        products: Sequence[Tensor | None] | None = None,
    ) -> Iterator[Tensor] | None:
        if type(self).compute_mask is not _Unstructured.compute_mask:
            return None  # a subclass ranks its own way: the generic path serves it
        flags = [_alive_flags(mask) for mask in masks]
        return self._rank(scores, flags, self._count, keep_dtype, products)

    def _rank(
        self,
        scores: Sequence[Tensor],
        flags: Sequence[Flags],
        count: Callable[[int], int],
        keep_dtype: Any,
        products: Sequence[Tensor | None] | None = None,
    ) -> Iterator[Tensor] | None:
        """Flat selections of the entries to prune, ranked where each flag is True.

        How many: `count` of the number of entries that compete, in all (it raises
        if the amount does not fit them). As bool (True = pruned), or with
        `keep_dtype` as 0/1 of that dtype (1 = kept). None when some scores cannot
        be ranked (NaN or infinity). `products`: see BasePruningMethod._choose.
        """
        raise NotImplementedError


class RandomUnstructured(_Unstructured):
    """Prunes `amount` entries chosen uniformly at random."""

    def _rank(
        self,
        scores: Sequence[Tensor],
        flags: Sequence[Flags],
        count: Callable[[int], int],
        keep_dtype: Any,
        products: Sequence[Tensor | None] | None = None,
    ) -> Iterator[Tensor] | None:
        assert products is None  # not _writes_products: its scores are noise
        counts = [alive_count(t, f()) for t, f in zip(scores, flags, strict=True)]
        k = count(sum(counts))
        ns = namespace(scores[0])
        device = scores[0].device
        if len(scores) == 1:
            noise = ns.rand(counts[0], device=device)
            sources: list[Source] = [lambda: (noise, None)]
        else:
            # Redrawn on every pass from per-tensor seeds instead of kept in memory.
            seed = int(ns.randint(0, 2**62, (1,)))
            sources = [_noise_source(ns, n, seed + i, device) for i, n in enumerate(counts)]
        if all(f() is None for f in flags):
            # Noise is never negative, so ranking it by magnitude is the same and skips a check.
            return smallest_k_many(
                sources, k, magnitude=True, keep_dtype=keep_dtype, total=sum(counts)
            )
        chosen = smallest_k_many(sources, k, magnitude=True, total=sum(counts))
        spread = (_spread(pick, t, f()) for pick, t, f in zip(chosen, scores, flags, strict=True))
        if keep_dtype is None:
            return spread
        return ((~pick).to(keep_dtype) for pick in spread)

    @classmethod
    def apply(cls, module: nn.Module, name: str, amount: float) -> BasePruningMethod:  # type: ignore[override]
        """Prune `amount` random entries of ``module.<name>``."""
        return super().apply(module, name, amount=amount)


class L1Unstructured(_Unstructured):
    """Prunes the `amount` entries of smallest absolute value."""

    _writes_products = True

    def _rank(
        self,
        scores: Sequence[Tensor],
        flags: Sequence[Flags],
        count: Callable[[int], int],
        keep_dtype: Any,
        products: Sequence[Tensor | None] | None = None,
    ) -> Iterator[Tensor] | None:
        sources = [_alive_source(t, f) for t, f in zip(scores, flags, strict=True)]
        # With no flags every entry competes; with flags the selection counts those that
        # compete as it reads them. It checks the scores are finite (in its one pass
        # when it can), after the amount.
        everything = all(f() is None for f in flags)
        total = sum(t.numel() for t in scores) if everything else None
        try:
            return smallest_k_many(
                sources,
                count,
                magnitude=True,
                keep_dtype=keep_dtype,
                total=total,
                finite=True,
                products=products,
            )
        except NotFinite:
            return None

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


def _all_ones(mask: Tensor) -> bool:
    low, high = namespace(mask).aminmax(mask) if mask.numel() else (1, 1)
    return bool(low == 1) and bool(high == 1)


Flags = Callable[[], "Tensor | None"]
"""Returns which entries of a tensor compete (its mask: where it is 1), or None for all."""


def _no_flags() -> None:
    return None


def _alive_flags(mask: Tensor | None) -> Flags:
    """The entries where `mask` is 1: the mask itself, which the selection kernels
    compare with 1 a chunk at a time (no flags as large as the tensor are made)."""
    if mask is None:
        return _no_flags
    return lambda: mask


def _alive_source(scores: Tensor, flags: Flags) -> Source:
    return lambda: (scores, flags())


def _spread(chosen: Tensor, t: Tensor, alive: Tensor | None) -> Tensor:
    """A selection made among the alive entries, put back at their places in `t`."""
    if alive is None:
        return chosen
    ns = namespace(t)
    full: Tensor = ns.zeros(t.numel(), dtype=ns.bool, device=t.device)
    return full.masked_scatter_(alive.reshape(-1) == 1, chosen)


def _noise_source(ns: ModuleType, count: int, seed: int, device: Any) -> Source:
    """Uniform noise for one tensor, drawn again identically on every call."""

    def draw() -> tuple[Tensor, None]:
        return seeded_rand(ns, count, seed, device), None

    return draw


class _Structured(_AmountMethod):
    """Prunes whole channels along `dim`: the `amount` with the smallest scores."""

    PRUNING_TYPE = "structured"

    def __init__(self, amount: float, dim: int = -1) -> None:
        super().__init__(amount)
        self.dim = validate_dim_type(dim, owner=type(self).__name__)

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        kept = self._kept_channels(t, default_mask.dtype)
        if kept is None:
            return default_mask
        if _all_ones(default_mask):
            return kept.expand(default_mask.shape).contiguous()  # a write, without a read
        return default_mask * kept

    def _first_mask(self, scores: Tensor, dtype: Any) -> Tensor | None:
        if type(self).compute_mask is not _Structured.compute_mask:
            return None
        kept = self._kept_channels(scores, dtype)
        if kept is None:
            ns = namespace(scores)
            ones: Tensor = ns.ones(scores.shape, dtype=dtype, device=scores.device)
            return ones
        return kept.expand(scores.shape).contiguous()

    def _kept_channels(self, t: Tensor, dtype: Any) -> Tensor | None:
        """1 (kept) or 0 per channel in `dtype`, shaped to broadcast; None if none is pruned."""
        owner = type(self).__name__
        validate_structured_tensor(tuple(t.shape), owner)
        dim = validate_dim(self.dim, t.dim(), owner)
        k = self._count(t.shape[dim])
        if k == 0:
            return None
        pruned = smallest_k(self._channel_scores(t, dim), k)
        shape = [1] * t.dim()
        shape[dim] = t.shape[dim]
        kept: Tensor = (~pruned).reshape(shape).to(dtype=dtype)
        return kept

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
            raise ValueError(
                f"CustomFromMask: the mask has shape {tuple(self.mask.shape)}; "
                f"expected the tensor's shape {tuple(default_mask.shape)}"
            )
        kept: Tensor = self.mask.to(dtype=default_mask.dtype, device=default_mask.device)
        if not _all_ones(default_mask):
            return default_mask * kept
        return kept.clone() if kept is self.mask and not self._owned else kept

    def _first_mask(self, scores: Tensor, dtype: Any) -> Tensor | None:
        if not self._owned or self.mask.dtype != dtype:
            return None
        if tuple(self.mask.shape) != tuple(scores.shape):
            return None  # compute_mask explains the mismatch
        return self.mask

    @classmethod
    def apply(cls, module: nn.Module, name: str, mask: Tensor) -> BasePruningMethod:  # type: ignore[override]
        """Prune ``module.<name>`` where `mask` is 0."""
        return super().apply(module, name, mask=mask)


def _require_finite(t: Tensor, owner: str, what: str = "scores") -> None:
    """Raise ValueError if `t` holds NaN or infinity: such values cannot be ranked."""
    if not all_finite(t):
        raise _unrankable(t, owner, what)


def _unrankable(t: Tensor, owner: str, what: str) -> ValueError:
    """The error for scores holding NaN or infinity (check_finite names the first one)."""
    check_finite(t, owner, what)
    return ValueError(f"{owner}: the {what} hold values that cannot be ranked")
