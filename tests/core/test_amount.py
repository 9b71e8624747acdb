"""amount.py: what counts as an amount, a dim and a norm order."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch.nn.utils.prune as torch_prune

from prunekit.core.amount import (
    compute_nparams_to_prune,
    validate_dim,
    validate_norm_order,
    validate_pruning_amount,
    validate_pruning_amount_init,
    validate_structured_tensor,
)


@pytest.mark.parametrize("amount", [0, 1, 7, 0.0, 0.5, 1.0, np.int64(3), np.float32(0.25)])
def test_valid_amounts_pass(amount: float) -> None:
    validate_pruning_amount_init(amount)


@pytest.mark.parametrize("amount", ["0.5", None, [0.5], True, False, 1j])
def test_non_numbers_are_type_errors(amount: object) -> None:
    with pytest.raises(TypeError, match="amount="):
        validate_pruning_amount_init(amount)


@pytest.mark.parametrize("amount", [-1, -0.1, 1.5, math.nan, math.inf, -math.inf])
def test_out_of_range_is_value_error(amount: float) -> None:
    with pytest.raises(ValueError, match=r"float in \[0, 1\].*int >= 0"):
        validate_pruning_amount_init(amount)


def test_error_names_its_owner() -> None:
    with pytest.raises(ValueError, match=r"^L1Unstructured: invalid amount=-2"):
        validate_pruning_amount_init(-2, owner="L1Unstructured")


@pytest.mark.parametrize(
    ("amount", "size", "expected"),
    [(3, 10, 3), (0.3, 10, 3), (0.25, 10, 2), (0.35, 10, 4), (0.5, 5, 2), (0.5, 7, 4), (1.0, 9, 9)],
)
def test_fraction_rounds_to_nearest_even(amount: float, size: int, expected: int) -> None:
    assert compute_nparams_to_prune(amount, size) == expected


@pytest.mark.parametrize(
    ("amount", "size", "expected"),
    [(np.float32(0.1), 5, 0), (np.float32(0.7), 5, 4), (np.float16(0.55), 10, 6)],
)
def test_numpy_fraction_rounds_in_its_own_precision_as_torch(
    amount: float, size: int, expected: int
) -> None:
    # torch rounds amount * size as computed in the amount's type: float32(0.1) * 5 is 0.5
    # there (0 pruned, as for the float 0.1), though float(float32(0.1)) * 5 is above 0.5.
    assert torch_prune._compute_nparams_toprune(amount, size) == expected
    assert compute_nparams_to_prune(amount, size) == expected


def test_numpy_half_fraction_of_a_large_tensor_does_not_overflow() -> None:
    # float16(0.5) * 200_000 is inf in float16 (torch raises OverflowError): counted in float.
    assert compute_nparams_to_prune(np.float16(0.5), 200_000) == 100_000


def test_fraction_type_is_accepted() -> None:
    validate_pruning_amount_init(Fraction(1, 3))
    assert compute_nparams_to_prune(Fraction(1, 3), 9) == 3


def test_count_above_size_is_rejected() -> None:
    validate_pruning_amount(10, 10)
    validate_pruning_amount(0.99, 1)
    with pytest.raises(ValueError, match="amount=11 is more than the 10 units"):
        validate_pruning_amount(11, 10)


def test_structured_needs_two_dims() -> None:
    validate_structured_tensor((3, 4))
    with pytest.raises(ValueError, match=r"shape \(5,\); expected a tensor with 2 or more dims"):
        validate_structured_tensor((5,))


@pytest.mark.parametrize(("dim", "ndim", "axis"), [(0, 2, 0), (-1, 2, 1), (-3, 3, 0), (2, 3, 2)])
def test_dims_normalize(dim: int, ndim: int, axis: int) -> None:
    assert validate_dim(dim, ndim) == axis


@pytest.mark.parametrize("dim", [2, -3, 10])
def test_dim_out_of_range(dim: int) -> None:
    with pytest.raises(IndexError, match=rf"dim={dim} is out of range.*\[-2, 1\]"):
        validate_dim(dim, 2)


@pytest.mark.parametrize("dim", [1.0, "0", None, True])
def test_dim_must_be_int(dim: object) -> None:
    with pytest.raises(TypeError, match="dim="):
        validate_dim(dim, 2)


@pytest.mark.parametrize("n", [1, 2, 0.5, 3.0, math.inf, -math.inf, "fro", "nuc"])
def test_valid_norm_orders(n: object) -> None:
    validate_norm_order(n)


@pytest.mark.parametrize("n", [0, -1, -2.5, math.nan, "l2", None, True])
def test_invalid_norm_orders(n: object) -> None:
    with pytest.raises(ValueError, match="norm order n="):
        validate_norm_order(n)
