"""Taylor: an entry's score is |W_ij * dL/dW_ij| summed over calibration batches, the
first-order estimate of how much the loss moves when the weight goes to zero."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from prunekit.core.errors import type_error, value_error
from prunekit.core.naming import TensorRef
from prunekit.criteria.criterion import Criterion, check_given_tensors

__all__ = ["Taylor", "taylor_product", "taylor_step"]


class Taylor(Criterion):
    """Scores given as accumulated ``|W * grad|``: one tensor, or a mapping from
    ``(module, name)`` to each tensor's (``prune_model(..., method="taylor")`` collects them
    itself).

    Entries rank by the absolute value of the saliency: a signed one (``W * grad``
    accumulated without the absolute value, as ``taylor_product`` gives it) is the
    first-order change of the loss, whose size ranks the entry; a negative value is no error.

    Args:
        saliency: the accumulated ``|W * grad|`` of the tensor ranked, shaped like it (or
            the signed ``W * grad``, ranked by its absolute value); or a mapping from
            ``(module, name)`` to each tensor's.

    Attributes:
        saliency: the scores as given; ``release()`` empties it once the masks are made.
    """

    by_magnitude = True

    def __init__(self, saliency: Tensor | Mapping[tuple[nn.Module, str], Tensor]) -> None:
        shaped = "a tensor shaped like the one ranked (keyed by (module, name))"
        check_given_tensors(saliency, "Taylor", "saliency", shaped)
        self.saliency = saliency

    def release(self) -> None:
        """Drop the scores (a mask made is never recomputed; the hook keeps the criterion)."""
        self.saliency = {}

    def scores(self, values: Tensor, target: TensorRef = None) -> Tensor:
        if isinstance(self.saliency, Mapping):
            if target is None or target not in self.saliency:
                raise type_error(
                    "Taylor: no gradients were accumulated for this tensor; expected one "
                    "of the (module, name) pairs calibrated"
                )
            found = self.saliency[target]
        else:
            found = self.saliency
        if tuple(found.shape) != tuple(values.shape):
            raise value_error(
                f"Taylor: saliency of shape {tuple(found.shape)}; expected the tensor's "
                f"shape {tuple(values.shape)}"
            )
        # Not rounded to a half-precision tensor's dtype: that would tie distinct scores.
        return found.to(dtype=torch.promote_types(found.dtype, values.dtype))


def taylor_product(weight: Tensor, grad: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """W * dL/dW entry by entry, signed (computed in `dtype` where given): an entry's Taylor
    score is its absolute value; a group criterion sums it over a unit's entries first."""
    w, g = weight.detach(), grad.detach()
    if dtype is not None:
        w, g = w.to(dtype), g.to(dtype)
    return w * g


def taylor_step(weight: Tensor, grad: Tensor, total: Tensor | None) -> Tensor:
    """Add one batch's |W * grad| to `total` (a new tensor when None); returns it. In float32
    at least: a half-precision product underflows, and a bfloat16 sum stops growing once
    it is 256 times a batch's share."""
    step = taylor_product(weight, grad, torch.promote_types(weight.dtype, torch.float32))
    step.abs_()
    return step if total is None else total.add_(step)
