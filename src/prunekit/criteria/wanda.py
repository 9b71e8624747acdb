"""Wanda: an entry's score is |W_ij| times the L2 norm of input feature j over the
calibration data (the size of what the weight multiplies, not only of the weight)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from prunekit.core.errors import type_error, value_error
from prunekit.core.naming import TensorRef
from prunekit.criteria.criterion import Criterion, check_given_tensors

__all__ = ["Wanda", "wanda_scores"]


class Wanda(Criterion):
    """Scores ``|W| * norms`` with one norm per input feature (dim 1 of the weight), or
    norms of the weight's own shape (the norm of the input each entry multiplies, as for
    a convolution's or a transposed weight: see criteria.layers.entry_norms).

    `norms` is one tensor (for whatever tensor is ranked) or a mapping from modules to
    theirs (``prune_model(..., method="wanda")`` collects them itself). Pair it with PerRow
    for Wanda as published (every output row loses the same share), or with NM for 2:4.

    Args:
        norms: the L2 norm of each input feature over the calibration data: one tensor, or a
            mapping from each module to its own (a tensor ranked without its module, as in
            ``method.prune(t)``, then has no norms). A norm must not be negative.

    Attributes:
        norms: the norms as given (not copied).
    """

    by_magnitude = True  # |W| * norm is never negative

    def __init__(self, norms: Tensor | Mapping[nn.Module, Tensor]) -> None:
        check_given_tensors(norms, "Wanda", "norms", "a tensor of input norms (keyed by module)")
        self.norms = norms

    def scores(self, values: Tensor, target: TensorRef = None) -> Tensor:
        norms = self._norms_for(target)
        negative = norms < 0  # ranked by magnitude, a negative norm would count as positive
        if bool(negative.any()):
            first = tuple(int(i) for i in negative.nonzero()[0])
            raise value_error(
                f"Wanda: the input norms hold {int(negative.sum())} negative value(s), e.g. "
                f"{float(norms[first])} at index {first}; expected norms >= 0 (the L2 norm "
                "of each input feature over the calibration data)"
            )
        if norms.shape == values.shape:  # the norm of what each entry multiplies
            return wanda_scores(values, norms)
        if values.dim() < 2 or norms.dim() != 1 or norms.shape[0] != values.shape[1]:
            raise value_error(
                f"Wanda: {norms.shape[0] if norms.dim() == 1 else tuple(norms.shape)} input "
                f"norms do not fit a tensor of shape {tuple(values.shape)}; expected one norm "
                "per entry of dim 1 (the input features)"
            )
        shape = [1] * values.dim()
        shape[1] = values.shape[1]
        return wanda_scores(values, norms.reshape(shape))

    def _norms_for(self, target: TensorRef) -> Tensor:
        if not isinstance(self.norms, Mapping):
            return self.norms
        if target is None or target[0] not in self.norms:
            where = "no module" if target is None else type(target[0]).__name__
            raise type_error(
                f"Wanda: no input norms for {where}; expected a module the norms were "
                "collected for (calibrate it first)"
            )
        return self.norms[target[0]]


def wanda_scores(values: Tensor, norms: Tensor) -> Tensor:
    """|values| x `norms` entry by entry (`norms` broadcast to `values`): the size of what
    each weight contributes to its output. In the wider of the two dtypes: float64 norms
    (as calibration gives them) rank by the product of the unrounded norms, so two scores
    closer than float32 resolves are not reordered by the norms' rounding."""
    wide = torch.promote_types(values.dtype, norms.dtype)
    # One allocation of the result, written twice: a large fresh tensor costs its page
    # faults, which on a big layer take as long as the arithmetic.
    shape = torch.broadcast_shapes(values.shape, norms.shape)  # type: ignore[no-untyped-call]
    scores = torch.empty(shape, dtype=wide, device=values.device)
    scores.copy_(values).abs_().mul_(norms.to(dtype=wide))
    return scores
