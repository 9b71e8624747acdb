"""select.py: exact counts and index-ordered ties."""

from __future__ import annotations

import pytest
import torch

from prunekit.select import smallest_k


def reference(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The k smallest by a stable sort: equal scores keep index order."""
    order = torch.sort(scores.reshape(-1), stable=True).indices
    chosen = torch.zeros(scores.numel(), dtype=torch.bool)
    chosen[order[:k]] = True
    return chosen.reshape(scores.shape)


@pytest.mark.parametrize("k", [0, 1, 5, 11, 12])
def test_matches_stable_sort(k: int) -> None:
    scores = torch.randn(3, 4)
    assert torch.equal(smallest_k(scores, k), reference(scores, k))


def test_ties_prune_lower_index_first() -> None:
    scores = torch.tensor([2.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    assert smallest_k(scores, 3).tolist() == [False, True, True, True, False, False]


def test_all_equal() -> None:
    chosen = smallest_k(torch.zeros(2, 5), 4)
    assert chosen.reshape(-1).tolist() == [True] * 4 + [False] * 6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtypes(dtype: torch.dtype) -> None:
    scores = torch.randint(0, 20, (200,)).to(dtype)
    assert torch.equal(smallest_k(scores, 77), reference(scores, 77))


@pytest.mark.parametrize("k", [-1, 13])
def test_k_out_of_range(k: int) -> None:
    with pytest.raises(ValueError, match=rf"k={k} is outside \[0, 12\]"):
        smallest_k(torch.randn(12), k)


def test_shape_and_dtype_of_result() -> None:
    chosen = smallest_k(torch.randn(2, 3, 4), 6)
    assert chosen.shape == (2, 3, 4)
    assert chosen.dtype == torch.bool
    assert int(chosen.sum()) == 6
