"""The masks of a state_dict's tensors: a method's criterion and pattern on plain tensors.

A state_dict has no modules, so its tensors are ranked as they are: the pattern
(Unstructured for 'l1' and 'random', Channels for 'ln') ranks the criterion's scores through
prunekit.select, one tensor at a time (scope 'layer') or all of them together ('global').
A tensor saved with a mask is pruned further: the entries (or channels) its mask pruned
stay pruned and do not compete. The masks are the ones the same methods install on a
model's parameters, bit for bit, and an error about a tensor names it from the start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from prunekit.core.amount import Amount, validate_dim
from prunekit.core.backend import multiply_
from prunekit.core.checks import check_binary_mask, check_finite
from prunekit.core.errors import naming, value_error
from prunekit.core.naming import Entry, mask_name
from prunekit.criteria import Criterion, Magnitude
from prunekit.io.options import offline_method
from prunekit.patterns import Channels, Pattern, Unstructured
from prunekit.whole.config import Config
from prunekit.whole.registry import OFFLINE, check_method_scope

__all__ = ["Ranking", "ranking", "saved_mask"]


@dataclass(frozen=True)
class Ranking:
    """How a state_dict's tensors are ranked.

    Attributes:
        criterion: scores each entry (Magnitude, Random).
        pattern: turns the scores into a mask (Unstructured, or Channels for 'ln').
        amount: a fraction in [0, 1] or a count of the pattern's units.
        owner: the name errors about the amount and the scores begin with (the method's
            class name, ``L1Unstructured``, as a model's pruning names it).
    """

    criterion: Criterion
    pattern: Pattern
    amount: float
    owner: str

    def count(self) -> Amount:
        """The amount, checked against the units of what it is applied to."""
        return Amount(self.amount, self.owner)

    def masks(
        self, chosen: Sequence[Entry], saved: Mapping[str, Tensor], scope: str
    ) -> dict[str, Tensor]:
        """The new mask of each of `chosen` (in its tensor's dtype), by name.

        Args:
            chosen: the entries to prune, in order (the order ties are broken in).
            saved: the checked masks the state_dict holds (see saved_mask), by name.
            scope: 'layer' (each tensor on its own) or 'global' (all ranked together).

        Returns:
            Every chosen entry's mask, its saved mask's zeros kept.

        Raises:
            ValueError, IndexError: an amount, dim or tensor that cannot be ranked, naming
                the tensor.
        """
        if scope == "global":
            return self._together(chosen, saved)
        return {e.name: self._alone(e.name, e.tensor.detach(), saved.get(e.name)) for e in chosen}

    def _alone(self, name: str, values: Tensor, saved: Tensor | None) -> Tensor:
        """The mask of one tensor, `saved` (its mask, or None) pruned further."""
        with naming(f"tensor {name!r}"):
            if saved is not None:
                mask = self.further(values, saved)
            else:
                first = self.pattern.first_mask(self.criterion, values, values.dtype, self.count())
                if first is None:
                    ones = torch.ones_like(values)
                    first = self.pattern.mask(self.criterion, values, ones, self.count())
                mask = first
        return mask.detach().to(dtype=values.dtype).contiguous()

    def further(self, values: Tensor, mask: Tensor) -> Tensor:
        """`mask` (0s and 1s in the dtype of `values`) pruned further: an unstructured
        pattern ranks the entries still 1, a structured one the channels still holding a 1
        (by the values the mask leaves)."""
        pattern, criterion = self.pattern, self.criterion
        if pattern.PRUNING_TYPE == "unstructured":
            kept = pattern.select(criterion, [values], [mask], self.count(), keep_dtype=mask.dtype)
            if kept is not None:
                return multiply_(next(kept).reshape(values.shape), mask)
            # Scores that cannot be ranked somewhere: rank the competing entries, gathered.
            new = mask.clone()
            alive = mask == 1
            partial = pattern.mask(criterion, values[alive], mask[alive], self.count())
            new[alive] = partial.to(dtype=mask.dtype)
            return new
        current = mask.to(dtype=values.dtype) * values
        dim = validate_dim(getattr(pattern, "dim", None), current.dim(), self.owner)
        others = [d for d in range(current.dim()) if d != dim]
        index = (slice(None),) * dim + (mask.sum(dim=others) != 0,)
        new = mask.clone()
        partial = pattern.mask(criterion, current[index], mask[index], self.count())
        new[index] = partial.to(dtype=mask.dtype)
        return new

    def _together(self, chosen: Sequence[Entry], saved: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Every chosen tensor's mask, all ranked as one (ties to the earlier tensor)."""
        values = [e.tensor.detach() for e in chosen]
        masks = [saved.get(e.name) for e in chosen]
        dtypes = {t.dtype for t in values}
        keep_dtype: Any = values[0].dtype if len(dtypes) == 1 else None
        kept = self.pattern.select(self.criterion, values, masks, self.count(), keep_dtype)
        if kept is None:
            flags = self._gathered(chosen, values, masks)
        else:
            flags = [
                (k if keep_dtype is not None else ~k).reshape(t.shape)
                for k, t in zip(kept, values, strict=True)
            ]
        out = {}
        for e, flag, t, old in zip(chosen, flags, values, masks, strict=True):
            new = flag.to(dtype=t.dtype)
            out[e.name] = new if old is None else old * new
        return out

    def _gathered(
        self, chosen: Sequence[Entry], values: list[Tensor], masks: list[Tensor | None]
    ) -> list[Tensor]:
        """The joint selection of tensors whose pruned entries hold NaN or infinity (the
        competing ones are finite): ranked as one vector of the tensors' entries."""
        for e, t, mask in zip(chosen, values, masks, strict=True):
            competing = t if mask is None else torch.where(mask == 1, t, torch.zeros_like(t))
            check_finite(competing, f"tensor {e.name!r}", "scores")
        merged = torch.cat([t.reshape(-1) for t in values])
        flat = [
            torch.ones(t.numel()) if m is None else m.reshape(-1)
            for t, m in zip(values, masks, strict=True)
        ]
        alive = torch.cat(flat).to(dtype=merged.dtype)
        final = self.further(merged, alive)
        out, offset = [], 0
        for t in values:
            out.append(final[offset : offset + t.numel()].reshape(t.shape))
            offset += t.numel()
        return out


def ranking(config: Config) -> Ranking:
    """The ranking of `config`'s method on plain tensors: 'l1' and 'random' entry by entry,
    'ln' by channels (its norm order `config.n`, default 2, along `config.dim`, default 0).

    Args:
        config: the checked arguments of the call (see whole.Config).

    Returns:
        The criterion, pattern and amount the tensors are ranked with.

    Raises:
        ValueError: a method that needs a model or calibration data (only the methods of
            whole.registry.OFFLINE prune a state_dict), a pattern other than
            'unstructured', or 'ln' in scope 'global'; each naming `config.owner`.
    """
    found = offline_method(config.method, config.owner)
    if not config.plain:
        raise value_error(
            f"{config.owner}: invalid pattern={config.chosen_pattern!r}; a state_dict is pruned "
            "with pattern='unstructured' (whole channels: method 'ln')"
        )
    assert found.pruning is not None  # every method of OFFLINE has one
    owner = found.pruning.__name__
    if found.criterion is not None:
        return Ranking(found.criterion(), Unstructured(), config.amount, owner)
    check_method_scope(found.name, config.scope, config.owner, OFFLINE)
    return Ranking(Magnitude(), Channels(config.axis, config.norm), config.amount, owner)


def saved_mask(entry: Entry) -> Tensor:
    """The mask a state_dict holds for `entry`, checked (0s and 1s, the tensor's shape) and
    copied into the tensor's dtype.

    Raises:
        TypeError, ValueError: a mask that is not one, naming the tensor.
    """
    mask, where = entry.mask, f"tensor {entry.name!r}"
    assert mask is not None
    if mask.dtype != torch.bool:  # bool masks are binary
        check_binary_mask(mask, where)
    if tuple(mask.shape) != tuple(entry.tensor.shape):
        raise value_error(
            f"{where}: the mask {mask_name(entry.name)!r} has shape {tuple(mask.shape)}; "
            f"expected the tensor's shape {tuple(entry.tensor.shape)}"
        )
    return mask.detach().to(dtype=entry.tensor.dtype, copy=True).contiguous()
