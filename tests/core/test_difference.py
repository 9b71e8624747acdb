"""One comparison of outputs for every check (core.difference): equal infinities are no
difference, NaN always is, and an infinity against anything else is an infinite one."""

from __future__ import annotations

import math

import pytest
import torch

from prunekit.core.difference import largest_difference, relative_difference

INF, NAN = math.inf, math.nan


def test_equal_infinities_are_no_difference_and_set_no_scale() -> None:
    a = torch.tensor([1.0, -INF, 2.0, INF])
    assert largest_difference(a, a.clone()) == (0.0, 2.0)
    b = torch.tensor([1.5, -INF, 2.0, INF])
    assert largest_difference(a, b) == (0.5, 2.0)
    assert relative_difference(b, a) == 0.25
    assert relative_difference(a.clone(), a) == 0.0


@pytest.mark.parametrize(
    ("expected", "found"),
    [([1.0, -INF], [1.0, 3.0]), ([1.0, 3.0], [1.0, -INF]), ([1.0, -INF], [1.0, INF])],
)
def test_an_infinity_against_another_value_is_an_infinite_difference(
    expected: list[float], found: list[float]
) -> None:
    diff, _ = largest_difference(torch.tensor(expected), torch.tensor(found))
    assert diff == INF
    assert relative_difference(torch.tensor(found), torch.tensor(expected)) == INF


@pytest.mark.parametrize(
    ("expected", "found"),
    [([1.0, NAN], [1.0, NAN]), ([1.0, NAN], [1.0, 2.0]), ([1.0, INF], [1.0, NAN])],
)
def test_nan_on_either_side_is_a_difference(expected: list[float], found: list[float]) -> None:
    diff, _ = largest_difference(torch.tensor(expected), torch.tensor(found))
    assert diff != diff
    assert relative_difference(torch.tensor(found), torch.tensor(expected)) == INF


def test_other_shapes_and_empty_outputs() -> None:
    assert relative_difference(torch.zeros(2), torch.zeros(3)) == INF
    assert largest_difference(torch.zeros(0), torch.zeros(0)) == (0.0, 0.0)
    assert relative_difference(torch.ones(2), torch.zeros(2)) == INF  # no scale to be within


def test_every_output_check_uses_it() -> None:
    """compact, remove_blocks and export's checks share the one comparison."""
    pytest.importorskip("gguf")
    from prunekit.export import gguf_check, hf_folder

    assert vars(hf_folder)["relative_difference"] is relative_difference
    assert vars(gguf_check)["relative_difference"] is relative_difference
