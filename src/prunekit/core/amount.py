"""Checks of the numbers a pruning call is given: amount, dim, norm order, tensor shape."""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass
from typing import Any

from prunekit.core.errors import index_error, type_error, value_error

__all__ = [
    "Amount",
    "compute_nparams_to_prune",
    "validate_dim",
    "validate_dim_type",
    "validate_norm_order",
    "validate_pruning_amount",
    "validate_pruning_amount_init",
    "validate_structured_tensor",
]

AMOUNT_RULE = "a float in [0, 1] (a fraction) or an int >= 0 (a count)"
NORM_RULE = "a positive number, float('inf'), float('-inf'), 'fro' or 'nuc'"


def validate_pruning_amount_init(amount: object, owner: str = "amount") -> None:
    """Check an amount before the tensor it applies to is known.

    Args:
        amount: a float in [0, 1] (a fraction) or an int >= 0 (a count).
        owner: what the error message names as the amount's owner.

    Raises:
        TypeError: `amount` is not a number (bools included).
        ValueError: `amount` is outside the allowed range (NaN included).
    """
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise type_error(
            f"{owner}: invalid amount={amount!r} of type {type(amount).__name__}; "
            f"expected {AMOUNT_RULE}"
        )
    if isinstance(amount, numbers.Integral):
        if amount < 0:
            raise value_error(f"{owner}: invalid amount={amount!r}; expected {AMOUNT_RULE}")
        return
    value = float(amount)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise value_error(f"{owner}: invalid amount={amount!r}; expected {AMOUNT_RULE}")


def compute_nparams_to_prune(amount: float, tensor_size: int) -> int:
    """Return how many of `tensor_size` units `amount` asks to prune.

    An int is a count; a float is a fraction of `tensor_size`, rounded with
    Python's round() (ties to even), as torch.nn.utils.prune does: the product is
    computed in the amount's own type (numpy's float32 rounds as float32), unless
    it overflows there (float16), where torch fails.

    Args:
        amount: a checked amount (see validate_pruning_amount_init).
        tensor_size: the number of units (entries or channels) available.

    Returns:
        The count to prune.
    """
    if isinstance(amount, numbers.Integral):
        return int(amount)
    product = _product(amount, tensor_size)
    if not math.isfinite(product):
        product = float(amount) * tensor_size
    return int(round(product))  # noqa: RUF046 (numpy 1.x rounds a numpy float to a float)


def _product(amount: Any, tensor_size: int) -> Any:
    """``amount * tensor_size`` in the amount's type; a numpy float that overflows gives
    inf without numpy's warning."""
    numpy = sys.modules.get("numpy") if type(amount).__module__ == "numpy" else None
    if numpy is None:
        return amount * tensor_size
    with numpy.errstate(over="ignore"):
        return amount * tensor_size


def validate_pruning_amount(amount: float, tensor_size: int, owner: str = "amount") -> None:
    """Check that a count `amount` does not exceed the `tensor_size` units available.

    Args:
        amount: a checked amount; a fraction always fits.
        tensor_size: the number of units available.
        owner: what the error message names as the amount's owner.

    Raises:
        ValueError: `amount` is a count above `tensor_size`.
    """
    if isinstance(amount, numbers.Integral) and amount > tensor_size:
        raise value_error(
            f"{owner}: amount={amount} is more than the {tensor_size} units available to prune; "
            f"expected a count <= {tensor_size} or a fraction in [0, 1]"
        )


@dataclass(frozen=True)
class Amount:
    """A method's `amount` and the name its errors go by (the method's class)."""

    value: float
    owner: str

    def count(self, units: int) -> int:
        """How many of `units` to prune; raises if a count exceeds them."""
        validate_pruning_amount(self.value, units, owner=self.owner)
        return compute_nparams_to_prune(self.value, units)


def validate_structured_tensor(shape: tuple[int, ...], owner: str = "tensor") -> None:
    """Structured pruning needs channels: a tensor of two or more dims."""
    if len(shape) <= 1:
        raise value_error(
            f"{owner}: structured pruning needs channels, got a tensor of shape "
            f"{tuple(shape)}; expected a tensor with 2 or more dims (prune 1-D tensors "
            "with an unstructured method)"
        )


def validate_dim_type(dim: Any, owner: str = "dim") -> int:
    """Return `dim` as an int (numpy integers too, as torch takes them); bool is refused."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise type_error(f"{owner}: invalid dim={dim!r}; expected an int")
    return int(dim)


def validate_dim(dim: Any, ndim: int, owner: str = "dim") -> int:
    """Return `dim` as a non-negative axis of an `ndim`-D tensor, or raise IndexError."""
    axis = validate_dim_type(dim, owner)
    if not -ndim <= axis < ndim:
        raise index_error(
            f"{owner}: dim={axis} is out of range for a tensor with {ndim} dims; "
            f"expected an int in [{-ndim}, {ndim - 1}]"
        )
    return axis % ndim


def validate_norm_order(n: Any, owner: str = "n") -> None:
    """Check `n`, the order of the norm that ranks channels."""
    if isinstance(n, str):
        if n in ("fro", "nuc"):
            return
    elif isinstance(n, numbers.Real) and not isinstance(n, bool):
        value = float(n)
        if value in (math.inf, -math.inf) or (math.isfinite(value) and value > 0):
            return
    raise value_error(f"{owner}: invalid norm order n={n!r}; expected {NORM_RULE}")
