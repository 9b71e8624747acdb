"""``module.<name>`` made during the selection's pass (first L1 prunings): mask * orig
written as the mask is, installed as mul's result would be."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["fusable", "made"]


def fusable(t: Tensor, dtype: Any) -> bool:
    """Whether mask * `t` may be made in the selection's pass: a contiguous CPU torch
    tensor of floats of `dtype` (the product's dtype)."""
    return (
        isinstance(t, Tensor)
        and t.device.type == "cpu"
        and t.dtype == dtype
        and t.is_floating_point()
        and t.is_contiguous()
    )


class _Multiplied(torch.autograd.Function):
    """mask * orig made already: the forward hands it over, the backward is mul's."""

    @staticmethod
    def forward(ctx: Any, orig: Tensor, mask: Tensor, made: list[Tensor]) -> Tensor:
        ctx.save_for_backward(mask)
        return made[0]  # in a list, so autograd does not take it for an input

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None, None


def made(product: Tensor, orig: Tensor, mask: Tensor) -> Tensor:
    """``module.<name>`` from mask * orig made during the selection: as apply_mask's
    would be, part of the graph when gradients are recorded."""
    if torch.is_grad_enabled() and orig.requires_grad:
        result: Tensor = _Multiplied.apply(orig, mask, [product])  # type: ignore[no-untyped-call]
        return result
    return product
