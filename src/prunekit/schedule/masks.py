"""The masks of one update: a criterion x pattern ranks only what is still alive.

Each update asks for the units (entries, or channels) that bring a tensor, or all the
tensors together, to the scheduled sparsity, counting the units pruned already: the
pattern ranks the alive ones only (the current mask as alive flags) and is told, through
an Amount, how many more to prune. So a pruned entry never comes back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from prunekit.core.amount import Amount, validate_dim
from prunekit.core.errors import value_error
from prunekit.criteria.criterion import Criterion
from prunekit.patterns.nm import NM
from prunekit.patterns.pattern import Pattern
from prunekit.patterns.per_row import PerRow

__all__ = ["global_masks", "layer_mask", "pruned_units", "units"]

Pair = tuple[torch.nn.Module, str]


def units(pattern: Pattern, shape: Sequence[int], owner: str) -> int:
    """How many units `pattern` counts in a tensor of `shape`: entries or channels."""
    if pattern.PRUNING_TYPE == "structured":
        return int(shape[_dim(pattern, len(shape), owner)])
    return int(torch.Size(shape).numel())


def pruned_units(pattern: Pattern, mask: Tensor | None, owner: str) -> int:
    """Units of `mask` pruned already: zero entries, or channels all zero."""
    if mask is None:
        return 0
    if pattern.PRUNING_TYPE == "structured":
        return int((~_alive_channels(mask, _dim(pattern, mask.dim(), owner))).sum())
    return int(mask.numel() - int(mask.count_nonzero()))


def layer_mask(
    criterion: Criterion,
    pattern: Pattern,
    values: Tensor,
    mask: Tensor | None,
    fraction: float,
    target: Pair,
    owner: str,
) -> Tensor:
    """The new mask of one tensor at sparsity `fraction` of its units (in values' dtype).

    `values` are what the criterion ranks: for entries, values right wherever `mask` is
    1; for channels, the tensor's current values (mask x orig).
    """
    current = torch.ones_like(values) if mask is None else mask.to(dtype=values.dtype)
    if isinstance(pattern, PerRow | NM):  # their counts are per row or group, not per tensor
        return _rowwise_mask(criterion, pattern, values, mask, current, fraction, target, owner)
    total = units(pattern, values.shape, owner)
    pruned = pruned_units(pattern, mask, owner)
    extra = max(round(fraction * total) - pruned, 0)
    if pattern.PRUNING_TYPE == "structured":  # one channel stays, as in prune_channels:
        extra = min(extra, max(total - pruned - 1, 0))  # compact cannot remove a whole layer
    if extra == 0:
        return current
    amount = Amount(extra, owner)
    if pattern.PRUNING_TYPE == "structured":
        dim = _dim(pattern, values.dim(), owner)
        index = (slice(None),) * dim + (_alive_channels(current, dim),)
        new = current.clone()
        new[index] = pattern.mask(criterion, values[index], current[index], amount, target)
        return new
    kept = pattern.select(
        criterion, [values], [mask], amount, keep_dtype=values.dtype, targets=[target]
    )
    if kept is not None:
        return next(kept).reshape(values.shape) * current
    # Values that cannot be ranked, or a pattern without that selection: it then masks
    # the alive entries, gathered.
    alive = current == 1
    _check_finite(values[alive], owner)
    new = current.clone()
    chosen = pattern.mask(criterion, values[alive], current[alive], amount, target)
    new[alive] = chosen.to(dtype=new.dtype)
    return new


def global_masks(
    criterion: Criterion,
    pattern: Pattern,
    values: Sequence[Tensor],
    masks: Sequence[Tensor | None],
    fraction: float,
    targets: Sequence[Pair],
    wheres: Sequence[str],
    owner: str,
) -> list[Tensor]:
    """New masks of all tensors at sparsity `fraction` of their entries, ranked together
    (PerRow and NM: row by row, group by group, whichever tensor holds them)."""
    if isinstance(pattern, PerRow | NM):
        return [
            layer_mask(criterion, pattern, t, m, fraction, pair, where)
            for t, m, pair, where in zip(values, masks, targets, wheres, strict=True)
        ]
    total = sum(t.numel() for t in values)
    pruned = sum(pruned_units(pattern, m, owner) for m in masks)
    currents = [
        torch.ones_like(t) if m is None else m.to(dtype=t.dtype)
        for t, m in zip(values, masks, strict=True)
    ]
    extra = max(round(fraction * total) - pruned, 0)
    if extra == 0:
        return currents
    dtypes = {t.dtype for t in values}
    keep_dtype: Any = next(iter(dtypes)) if len(dtypes) == 1 else None
    kept = pattern.select(
        criterion, values, masks, Amount(extra, owner), keep_dtype=keep_dtype, targets=targets
    )
    if kept is None:
        # Values that cannot be ranked are named (what lies behind the masks never counts:
        # the selection does not read it), else the pattern has no such selection.
        for t, current, where in zip(values, currents, wheres, strict=True):
            _check_finite(t[current == 1], where)
        raise value_error(
            f"{owner}: pattern={pattern!r} cannot rank several tensors together "
            "(its select() gave None); expected scope='layer' for it"
        )
    new = []
    for k, t, current in zip(kept, values, currents, strict=True):
        flags = k if keep_dtype is not None else (~k).to(dtype=t.dtype)
        new.append(flags.reshape(t.shape) * current)
    return new


def _rowwise_mask(
    criterion: Criterion,
    pattern: PerRow | NM,
    values: Tensor,
    mask: Tensor | None,
    current: Tensor,
    fraction: float,
    target: Pair,
    owner: str,
) -> Tensor:
    """The new mask at `fraction` for a pattern that prunes each row (PerRow: each row to
    `fraction` of its entries) or group (NM: to its one sparsity) among the alive entries."""
    if fraction == 0:
        return current
    if isinstance(pattern, NM):
        if not math.isclose(fraction, pattern.fraction, rel_tol=0, abs_tol=1e-9):
            raise value_error(
                f"{owner}: {pattern!r} prunes {pattern.fraction:g} of every group of "
                f"{pattern.m}, not the scheduled sparsity {fraction:g}; expected a schedule "
                f"that gives {pattern.fraction:g} alone (schedule='constant', "
                f"final_amount={pattern.fraction:g})"
            )
        amount = Amount(pattern.fraction, owner)  # a group keeps at most n of those alive
    else:
        if values.dim() < 2:
            amount = Amount(fraction, owner)  # PerRow refuses it, naming the shape
        else:
            dim = validate_dim(pattern.dim, values.dim(), owner)
            length = math.prod(values.shape) // values.shape[dim] if values.shape[dim] else 0
            rows = current.movedim(dim, 0).reshape(values.shape[dim], length)
            extra = (round(fraction * length) - (rows == 0).sum(1)).clamp(min=0)
            if not bool((extra == extra[:1]).all()):
                raise value_error(
                    f"{owner}: {pattern!r} cannot bring rows pruned unevenly before (they "
                    f"need {sorted(set(extra.tolist()))[:5]} more entries pruned) to "
                    f"{fraction:g} at once; expected rows with as many entries pruned each"
                )
            if extra.numel() == 0 or int(extra[0]) == 0:
                return current
            amount = Amount(int(extra[0]), owner)
    kept = pattern.select(
        criterion, [values], [mask], amount, keep_dtype=values.dtype, targets=[target]
    )
    assert kept is not None  # a RowwisePattern selects tensor by tensor
    return next(kept).reshape(values.shape) * current


def _check_finite(values: Tensor, where: str) -> None:
    bad = ~torch.isfinite(values)
    if bool(bad.any()):
        first = values[bad][0].item()
        raise value_error(
            f"{where}: its values hold {first} ({int(bad.sum())} entries not finite), "
            "which cannot be ranked; expected finite values"
        )


def _alive_channels(mask: Tensor, dim: int) -> Tensor:
    others = [d for d in range(mask.dim()) if d != dim]
    flags: Tensor = mask.ne(0).any(dim=others) if others else mask.ne(0)
    return flags


def _dim(pattern: Pattern, ndim: int, owner: str) -> int:
    dim = getattr(pattern, "dim", None)
    if dim is None:
        raise value_error(
            f"{owner}: pattern={pattern!r} is 'structured' but has no attribute 'dim' "
            "saying which axis holds the channels; expected one, as prunekit.Channels has"
        )
    return validate_dim(dim, ndim, owner)
