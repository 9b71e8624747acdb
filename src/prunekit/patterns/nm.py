"""NM: keep `n` of every `m` consecutive entries along the input dimension (2:4, 4:8)."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

from torch import Tensor

from prunekit.core.amount import Amount, validate_dim, validate_dim_type
from prunekit.core.backend import framework
from prunekit.core.errors import type_error, value_error
from prunekit.core.naming import TensorRef
from prunekit.patterns.tensorwise import RowwisePattern, competing_scores
from prunekit.select.rows import smallest_in_short_rows, smallest_per_row

if TYPE_CHECKING:  # a pattern ranks by a criterion: criteria stand above patterns
    from prunekit.criteria.criterion import Criterion

__all__ = ["NM"]

_RANKED = 8
"""Groups up to this size are ranked by pairwise comparisons (m * (m - 1) of them)."""


class NM(RowwisePattern):
    """Keeps `n` of every `m` consecutive entries: the layout sparse tensor cores run (2:4).

    In every group of `m` consecutive entries along `dim` (default 1: the input features
    of a Linear weight, the input channels of a convolution's), the `m - n` of smallest
    score are pruned and `n` are kept.

    The amount is fixed by the pattern: it must be the fraction ``(m - n) / m`` (0.5 for
    2:4 and 4:8). The size along `dim` must be a multiple of `m`. Entries pruned before stay
    pruned: a group keeps at most `n` of the entries it still has, so a group with `n` or
    fewer left loses nothing more. Ties go to the lower index within the group. Every group
    of the result holds at most `n` non-zero entries.

    Args:
        n: the entries kept in every group, an int with ``1 <= n < m``.
        m: the size of a group of consecutive entries (4 for 2:4).
        dim: the axis along which the groups run (1 by default: a Linear weight's input
            features).

    Attributes:
        PRUNING_TYPE: ``"unstructured"``: a later pruning ranks the entries still unpruned.

    Raises:
        TypeError: `n`, `m` or `dim` is not an int (a bool is not one).
        ValueError: not ``1 <= n < m``.
    """

    PRUNING_TYPE = "unstructured"  # a later pruning ranks the entries still unpruned

    def __init__(self, n: int, m: int, dim: int = 1) -> None:
        for label, value in (("n", n), ("m", m)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise type_error(f"NM: invalid {label}={value!r}; expected an int")
        if not 1 <= n < m:
            raise value_error(f"NM: invalid n={n}, m={m}; expected ints with 1 <= n < m")
        self.n = int(n)
        self.m = int(m)
        self.dim = validate_dim_type(dim, owner="NM")

    @property
    def fraction(self) -> float:
        """The share of entries a first pruning removes: (m - n) / m."""
        return (self.m - self.n) / self.m

    def check(self, shape: tuple[int, ...], amount: Amount) -> int:
        """Check `amount` and a tensor's `shape` for this pattern.

        Args:
            shape: the shape of the tensor to prune.
            amount: the amount asked, which must be ``(m - n) / m``.

        Returns:
            The axis of the groups, made non-negative.

        Raises:
            ValueError: the amount is not ``(m - n) / m``, the tensor is a scalar, `dim` is
                out of its range, or its size along `dim` is not a multiple of `m`.
        """
        owner = amount.owner
        value = amount.value
        if isinstance(value, numbers.Integral) or not math.isclose(
            float(value), self.fraction, rel_tol=0, abs_tol=1e-9
        ):
            raise value_error(
                f"{owner}: invalid amount={value!r} for {self!r}, which prunes {self.m - self.n}"
                f" of every {self.m} entries; expected amount={self.fraction}"
            )
        if len(shape) == 0:
            raise value_error(f"{owner}: {self!r} needs a tensor with dims, got a scalar")
        dim = validate_dim(self.dim, len(shape), owner)
        if shape[dim] % self.m:
            raise value_error(
                f"{owner}: {self!r} groups {self.m} consecutive entries along dim {dim}, whose "
                f"size {shape[dim]} (shape {tuple(shape)}) is not a multiple of {self.m}; "
                f"expected a size divisible by {self.m}"
            )
        return dim

    def _keep(
        self,
        criterion: Criterion,
        t: Tensor,
        mask: Tensor | None,
        amount: Amount,
        target: TensorRef,
    ) -> Tensor:
        """A bool tensor shaped like `t`: False where this pruning prunes."""
        dim = self.check(tuple(t.shape), amount)
        scores = competing_scores(criterion, t, target, amount.owner, "scores", mask)
        moved = scores.movedim(dim, -1)
        groups = moved.reshape(-1, self.m)
        alive = None
        if mask is not None:
            alive = (mask.reshape(t.shape) == 1).movedim(dim, -1).reshape(groups.shape)
        pruned = self.pruned_groups(groups, alive)
        keep: Tensor = (~pruned).reshape(moved.shape).movedim(-1, dim)
        return keep

    def pruned_groups(self, groups: Tensor, alive: Tensor | None) -> Tensor:
        """True where groups x m finite `groups` of scores lose an entry: the smallest
        competing ones beyond the `n` largest of each group.

        Args:
            groups: a (groups, m) tensor of finite scores, one row per group.
            alive: bool flags of the entries still unpruned, shaped like `groups`; None:
                all of them.

        Returns:
            Bool flags shaped like `groups`, True where the entry is pruned now.
        """
        if alive is None:
            if self.m <= _RANKED and framework(groups) == "torch":
                return smallest_in_short_rows(groups, self.m - self.n)
            return smallest_per_row(groups, self.m - self.n, None)
        extra = (alive.sum(dim=1) - self.n).clamp(min=0)
        return smallest_per_row(groups, extra, alive)

    def __repr__(self) -> str:
        dim = "" if self.dim == 1 else f", dim={self.dim}"
        return f"NM({self.n}, {self.m}{dim})"
