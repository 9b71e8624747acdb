"""Magnitude: entries rank by their absolute value (L1; channels by a norm)."""

from __future__ import annotations

from torch import Tensor

from prunekit.core.naming import TensorRef
from prunekit.criteria.criterion import Criterion

__all__ = ["Magnitude"]


class Magnitude(Criterion):
    """The entries of smallest absolute value go first; channels by the norm of their
    entries (the pattern's norm order).

    Attributes:
        by_magnitude: True: the tensor's values are the scores, ranked by absolute value.
    """

    by_magnitude = True
    _values_are_scores = True

    def scores(self, values: Tensor, target: TensorRef = None) -> Tensor:
        return values  # ranked by |values|: the selection takes the magnitude itself
