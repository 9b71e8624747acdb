"""The Criterion protocol: a tensor's values (or the importance scores given for it) in,
one score per entry out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from torch import Tensor

from prunekit.core.backend import is_tensor
from prunekit.core.checks import check_kind
from prunekit.core.errors import type_error, value_error
from prunekit.core.naming import TensorRef
from prunekit.select import Source

__all__ = ["Criterion"]


class Criterion(ABC):
    """Ranks the entries of a tensor: those with the smallest scores are pruned first.

    Subclasses write ``scores(values, target)``. `values` is the tensor's current values,
    or the importance_scores a caller gave for it; `target` is its ``(module, name)``
    where known (None in ``method.prune(t)``), for criteria that keep what they learned
    per module. The scores must be shaped like `values`, floating point, and the same
    every time: a selection calls ``scores`` about once per pass over the tensors (a few
    times per pruning) rather than holding every tensor's scores at once.

    Set ``by_magnitude = True`` when entries rank by the absolute value of their scores
    (or when the scores are never negative, where it is the same). Either way the
    selection reads them chunk by chunk, without sorting and without concatenating
    tensors; with negative scores ranked by signed value it first checks that there are.

    Attributes:
        by_magnitude: True when the entries rank by the absolute value of their scores,
            False (the default) by the signed value.
    """

    by_magnitude: ClassVar[bool] = False
    _values_are_scores: ClassVar[bool] = False
    """True when ``scores(values)`` is `values` itself: mask * values can then be made in
    the selection's pass (it is ``module.<name>``)."""
    _compact: ClassVar[bool] = False
    """True for criteria that draw scores for the competing entries only (Random)."""

    @abstractmethod
    def scores(self, values: Tensor, target: TensorRef = None) -> Tensor:
        """One score per entry of `values`, shaped like it.

        Args:
            values: the tensor's current values, or the importance scores a caller gave.
            target: the tensor's ``(module, name)`` where known (None in
                ``method.prune(t)``), for criteria that keep what they learned per module.

        Returns:
            A floating-point tensor shaped like `values`; the lowest scores are pruned first.
        """

    def channel_scores(self, values: Tensor, dim: int, target: TensorRef = None) -> Tensor | None:
        """One score per channel along `dim`, for patterns that prune whole channels; None
        (the default) lets the pattern reduce the entries' scores with its norm.

        Args:
            values: the tensor's current values, or the importance scores a caller gave.
            dim: the axis of the channels.
            target: the tensor's ``(module, name)`` where known.

        Returns:
            A 1-D tensor of ``values.shape[dim]`` finite scores (Channels refuses another
            shape, NaN or infinity), or None.
        """
        return None

    def _source(self, values: Tensor, alive: Tensor | None, target: TensorRef) -> Source:
        """What the selection reads for one tensor: its scores, and which entries compete."""
        if self._values_are_scores:
            return lambda: (values, alive)
        return lambda: (self._checked_scores(values, target), alive)

    def _checked_scores(self, values: Tensor, target: TensorRef) -> Tensor:
        scores = self.scores(values, target)
        owner = type(self).__name__
        if not is_tensor(scores) or not scores.is_floating_point():
            raise type_error(
                f"{owner}.scores returned {type(scores).__name__} of dtype "
                f"{getattr(scores, 'dtype', None)}; expected a floating-point tensor"
            )
        if tuple(scores.shape) != tuple(values.shape):
            raise value_error(
                f"{owner}.scores returned shape {tuple(scores.shape)}; expected the "
                f"tensor's shape {tuple(values.shape)}"
            )
        result: Tensor = scores.detach()
        return result

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def check_given_tensors(given: object, owner: str, what: str, expected: str) -> None:
    """Refuse a criterion's given `what` (one tensor, or a mapping to tensors) that holds
    something else, naming its type (and, for a mapping, its key) and `expected`, or a
    tensor without values a ranking reads (meta, sparse or complex: ``check_kind``)."""
    each = given.items() if isinstance(given, Mapping) else [(None, given)]
    for key, found in each:
        where = "" if key is None else f" for {key!r:.60}"
        if not is_tensor(found):
            raise type_error(
                f"{owner}: invalid {what}{where} of type {type(found).__name__}; expected "
                f"{expected}, or a mapping to such tensors (as prunekit.calibrate collects them)"
            )
        check_kind(found, owner, f"{what}{where}")
