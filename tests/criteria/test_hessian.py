"""SparseGPT's factor of the inverse Hessian: its check for entries that are not finite."""

from __future__ import annotations

import pytest
import torch

from prunekit.criteria.hessian import inverse_factor


def test_finite_entries_whose_sum_overflows_are_factored() -> None:
    h = torch.tensor([[1e38, 0.9e38], [0.9e38, 1e38]])  # finite; their sum is not (float32)
    assert not torch.isfinite(h.sum())
    upper, dead = inverse_factor(h, 0.0, "t")
    inverse = torch.linalg.inv(h.double())
    assert torch.allclose((upper.T @ upper).double(), inverse, rtol=1e-4, atol=0)
    assert not dead.any()


@pytest.mark.parametrize(
    ("entries", "kind"),
    [((float("nan"),), "NaN"), ((float("inf"),), "inf"), ((float("inf"), -float("inf")), "inf")],
)
def test_an_entry_not_finite_is_named(entries: tuple[float, ...], kind: str) -> None:
    h = torch.eye(4)
    for i, value in enumerate(entries):
        h[i, 3 - i] = value
    with pytest.raises(ValueError, match=rf"t: the layer's Hessian .* holds {kind} entries"):
        inverse_factor(h, 0.01, "t")
