"""select.py: exact counts and index-ordered ties, on both frameworks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from frameworks import Framework
from prunekit.select import smallest_k


def reference(scores: Any, k: int) -> list[Any]:
    """The k smallest by torch's stable sort: equal scores keep index order."""
    values = torch.tensor(scores.tolist(), dtype=torch.float64)
    order = torch.sort(values.reshape(-1), stable=True).indices
    chosen = torch.zeros(values.numel(), dtype=torch.bool)
    chosen[order[:k]] = True
    result: list[Any] = chosen.reshape(values.shape).tolist()
    return result


@pytest.mark.parametrize("k", [0, 1, 5, 11, 12])
def test_matches_stable_sort(framework: Framework, k: int) -> None:
    scores = framework.ns.randn(3, 4)
    assert smallest_k(scores, k).tolist() == reference(scores, k)


def test_ties_prune_lower_index_first(framework: Framework) -> None:
    scores = framework.tensor([2.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    assert smallest_k(scores, 3).tolist() == [False, True, True, True, False, False]


def test_all_equal(framework: Framework) -> None:
    chosen = smallest_k(framework.ns.zeros(2, 5), 4)
    assert chosen.reshape(-1).tolist() == [True] * 4 + [False] * 6


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_dtypes(framework: Framework, dtype: str) -> None:
    scores = framework.ns.randint(0, 20, (200,)).to(framework.dtype(dtype))
    assert smallest_k(scores, 77).tolist() == reference(scores, 77)


@pytest.mark.parametrize("k", [-1, 13])
def test_k_out_of_range(framework: Framework, k: int) -> None:
    with pytest.raises(ValueError, match=rf"k={k} is outside \[0, 12\]"):
        smallest_k(framework.ns.randn(12), k)


def test_shape_and_dtype_of_result(framework: Framework) -> None:
    chosen = smallest_k(framework.ns.randn(2, 3, 4), 6)
    assert tuple(chosen.shape) == (2, 3, 4)
    assert chosen.dtype == framework.ns.bool
    assert int(chosen.sum()) == 6
