"""core.counting.zero_count: zeros of every dtype, -0.0 included, any layout."""

from __future__ import annotations

import pytest
import torch

from prunekit.core.counting import zero_count

FLOATS = [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_counts_both_signs_of_zero(dtype: torch.dtype) -> None:
    values = torch.tensor([0.0, -0.0, 1.0, -2.0, 0.5, 0.0]).to(dtype)
    assert zero_count(values) == 3


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nan_and_inf_are_not_zero(dtype: torch.dtype) -> None:
    values = torch.tensor([float("nan"), 0.0, -float("inf")]).to(dtype)
    assert zero_count(values) == 1  # float8_e4m3fn has no inf: it becomes NaN, still not zero


def test_integers_and_bools() -> None:
    assert zero_count(torch.tensor([0, 3, 0, -1])) == 2
    assert zero_count(torch.tensor([True, False, False])) == 2


def test_a_strided_view_counts_its_own_entries() -> None:
    grid = torch.zeros(4, 6)
    grid[:, ::2] = 1.0
    column = grid[:, 1]  # zeros, not contiguous
    assert zero_count(column) == 4
    assert zero_count(grid.t()) == 12


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_tensor_of_many_chunks_counts_across_their_edges(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prunekit.core import counting

    monkeypatch.setattr(counting, "_CHUNK", 8)
    values = torch.arange(1, 28, dtype=torch.float32).to(dtype).reshape(3, 9)
    values[0, 7:] = 0.0  # across the first edge
    values[1, 6] = -0.0
    values[2, 8] = 0.0  # in the last, short chunk
    assert zero_count(values) == 4
    assert zero_count(values.t()) == 4  # not contiguous: the whole at once
