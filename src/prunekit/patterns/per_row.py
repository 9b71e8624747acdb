"""PerRow: every row (output channel) loses the same share of its entries, as Wanda prunes."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

from torch import Tensor

from prunekit.core.amount import Amount, validate_dim, validate_dim_type
from prunekit.core.backend import namespace
from prunekit.core.errors import value_error
from prunekit.core.naming import TensorRef
from prunekit.patterns.tensorwise import RowwisePattern, competing_scores
from prunekit.select.rows import smallest_per_row

if TYPE_CHECKING:  # a pattern ranks by a criterion: criteria stand above patterns
    from prunekit.criteria.criterion import Criterion

__all__ = ["PerRow"]


class PerRow(RowwisePattern):
    """Prunes `amount` of each row: the slices along `dim` (0: the output rows of a Linear
    weight, the filters of a convolution) each lose their entries of smallest score.

    A fraction is a fraction of each row's entries still unpruned (rounded per row as
    everywhere: Python's round); a count is pruned from every row, and fails if some row
    has fewer entries left. Entries pruned before stay pruned. Ties go to the lower index
    within the row. Several tensors given at once (global pruning) are pruned row by row
    all the same: a row is a row, whichever tensor holds it.

    Args:
        dim: the axis of the rows (0 by default); each slice along it is pruned on its own,
            and tensors of fewer than 2 dims are refused when pruned.

    Attributes:
        PRUNING_TYPE: ``"unstructured"``: a later pruning ranks the entries still unpruned.
    """

    PRUNING_TYPE = "unstructured"  # a later pruning ranks the entries still unpruned

    def __init__(self, dim: int = 0) -> None:
        self.dim = validate_dim_type(dim, owner="PerRow")

    def _keep(
        self,
        criterion: Criterion,
        t: Tensor,
        mask: Tensor | None,
        amount: Amount,
        target: TensorRef,
    ) -> Tensor:
        """A bool tensor shaped like `t`: False where this pruning prunes (pruned-before
        entries read True: the old mask keeps them at 0)."""
        owner = amount.owner
        if t.dim() < 2:
            raise value_error(
                f"{owner}: per-row pruning needs rows, got a tensor of shape {tuple(t.shape)}; "
                "expected a tensor with 2 or more dims"
            )
        dim = validate_dim(self.dim, t.dim(), owner)
        scores = competing_scores(criterion, t, target, owner, "scores", mask)
        moved = scores.movedim(dim, 0)
        matrix = moved.reshape(moved.shape[0], math.prod(moved.shape[1:]))  # not -1: 0 rows
        alive = None
        if mask is not None:
            alive = (mask.reshape(t.shape) == 1).movedim(dim, 0).reshape(matrix.shape)
        counts = _row_counts(matrix, alive, amount)
        pruned = smallest_per_row(matrix, counts, alive)
        keep: Tensor = (~pruned).reshape(moved.shape).movedim(0, dim)
        return keep

    def __repr__(self) -> str:
        return f"PerRow(dim={self.dim})"


def _row_counts(matrix: Tensor, alive: Tensor | None, amount: Amount) -> Tensor | int:
    """How many entries each row loses: one int when all rows lose the same number."""
    rows, cols = matrix.shape
    if alive is None:
        return amount.count(cols)
    left = alive.sum(dim=1)
    fewest = int(left.min()) if rows else 0
    if isinstance(amount.value, numbers.Integral):
        amount.count(fewest)  # a count must fit the row with the fewest entries left
        return int(amount.value)
    ns = namespace(matrix)
    # Python's round(fraction * units), ties to even, row by row (float64 as Python's).
    counts: Tensor = ns.round(left.to(ns.float64) * float(amount.value)).to(ns.int64)
    if rows and bool((counts == counts[0]).all()):
        return int(counts[0])
    return counts
