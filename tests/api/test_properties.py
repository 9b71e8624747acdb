"""Properties every mask keeps, on random shapes, values, amounts and default masks.

Each property runs on both frameworks: the values are drawn with torch and copied.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import prunekit as prune
from helpers.frameworks import FRAMEWORK_NAMES, Framework
from prunekit.core.amount import compute_nparams_to_prune
from prunekit.dropin.base_method import combine_masks

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def tensors(draw: st.DrawFn, min_dims: int = 1) -> torch.Tensor:
    shape = draw(st.lists(st.integers(1, 5), min_size=min_dims, max_size=4))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=gen)
    if draw(st.booleans()):  # many ties
        t = t.round()
    return t


@st.composite
def default_masks(draw: st.DrawFn, t: torch.Tensor) -> torch.Tensor:
    seed = draw(st.integers(0, 2**31 - 1))
    density = draw(st.sampled_from([1.0, 0.8, 0.5, 0.0]))
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(t.shape, generator=gen) < density).float()


def amounts(units: int) -> st.SearchStrategy[float]:
    return st.one_of(st.integers(0, units), st.floats(0.0, 1.0))


on_both = pytest.mark.parametrize("name", FRAMEWORK_NAMES)


def check_mask(mask: Any, t: Any, default: Any) -> None:
    assert tuple(mask.shape) == tuple(t.shape)
    assert mask.dtype == default.dtype
    assert bool(((mask == 0) | (mask == 1)).all())
    assert bool((mask[default == 0] == 0).all())


@on_both
@SETTINGS
@given(data=st.data(), t=tensors())
def test_unstructured_masks(data: st.DataObject, t: torch.Tensor, name: str) -> None:
    fw = Framework(name)
    default = fw.tensor(data.draw(default_masks(t)))
    t = fw.tensor(t)
    amount = data.draw(amounts(t.numel()))
    cls = data.draw(st.sampled_from([prune.L1Unstructured, prune.RandomUnstructured]))
    mask = cls(amount).compute_mask(t, default)
    check_mask(mask, t, default)
    # ranked over all entries: exactly k are newly or already zero among the chosen
    k = compute_nparams_to_prune(amount, t.numel())
    assert int((mask == 0).sum()) >= k
    assert int(((mask == 0) & (default == 1)).sum()) <= k


@on_both
@SETTINGS
@given(data=st.data(), t=tensors())
def test_container_unstructured_prunes_exactly_k_of_the_unpruned(
    data: st.DataObject, t: torch.Tensor, name: str
) -> None:
    fw = Framework(name)
    default = fw.tensor(data.draw(default_masks(t)))
    t = fw.tensor(t)
    alive = int(default.sum())
    amount = data.draw(amounts(alive))
    method = data.draw(st.sampled_from([prune.L1Unstructured, prune.RandomUnstructured]))(amount)
    mask = combine_masks(method, t, default)
    check_mask(mask, t, default)
    assert alive - int(mask.sum()) == compute_nparams_to_prune(amount, alive)


@on_both
@SETTINGS
@given(data=st.data(), t=tensors())
def test_l1_prunes_no_larger_magnitude_than_it_keeps(
    data: st.DataObject, t: torch.Tensor, name: str
) -> None:
    fw = Framework(name)
    default = fw.tensor(data.draw(default_masks(t)))
    t = fw.tensor(t)
    amount = data.draw(amounts(int(default.sum())))
    mask = combine_masks(prune.L1Unstructured(amount), t, default)
    newly = (mask == 0) & (default == 1)
    kept = mask == 1
    if newly.any() and kept.any():
        assert t.abs()[newly].max() <= t.abs()[kept].min()
        # among equal magnitudes at the boundary, lower flat indices went first
        boundary = t.abs()[newly].max()
        flat_abs, flat_new = t.abs().reshape(-1), newly.reshape(-1)
        tied = ((flat_abs == boundary) & (default.reshape(-1) == 1)).nonzero().reshape(-1)
        chosen = flat_new[tied]
        assert chosen.tolist() == sorted(chosen.tolist(), reverse=True)


@on_both
@SETTINGS
@given(data=st.data(), t=tensors(min_dims=2))
def test_structured_masks_prune_whole_channels(
    data: st.DataObject, t: torch.Tensor, name: str
) -> None:
    fw = Framework(name)
    default = fw.tensor(data.draw(default_masks(t)))
    t = fw.tensor(t)
    dim = data.draw(st.integers(-t.dim(), t.dim() - 1))
    channels = t.shape[dim]
    amount = data.draw(amounts(channels))
    n = data.draw(st.sampled_from([1, 2, math.inf, -math.inf, "fro"]))
    method = data.draw(
        st.sampled_from([prune.LnStructured(amount, n, dim), prune.RandomStructured(amount, dim)])
    )
    mask = method.compute_mask(t, default)
    check_mask(mask, t, default)
    # each channel is either left as the default mask had it or zeroed whole
    axis = dim % t.dim()
    zeroed = [
        c for c in range(channels) if not fw.equal(mask.select(axis, c), default.select(axis, c))
    ]
    assert all(mask.select(axis, c).sum() == 0 for c in zeroed)
    k = compute_nparams_to_prune(amount, channels)
    assert len(zeroed) <= k
    dead = [c for c in range(channels) if mask.select(axis, c).sum() == 0]
    assert len(dead) >= k


@on_both
@SETTINGS
@given(data=st.data(), t=tensors(min_dims=2))
def test_container_structured_prunes_k_of_the_live_channels(
    data: st.DataObject, t: torch.Tensor, name: str
) -> None:
    fw = Framework(name)
    default = fw.tensor(data.draw(default_masks(t)))
    t = fw.tensor(t)
    dim = data.draw(st.integers(0, t.dim() - 1))
    others = [d for d in range(t.dim()) if d != dim]
    live = int((default.sum(dim=others) != 0).sum())
    amount = data.draw(amounts(live))
    mask = combine_masks(prune.LnStructured(amount, 1, dim), t, default)
    check_mask(mask, t, default)
    now_live = int((mask.sum(dim=others) != 0).sum())
    assert live - now_live == compute_nparams_to_prune(amount, live)


@on_both
@SETTINGS
@given(data=st.data(), t=tensors())
def test_equal_inputs_give_equal_masks(data: st.DataObject, t: torch.Tensor, name: str) -> None:
    fw = Framework(name)
    t = fw.tensor(t)
    amount = data.draw(amounts(t.numel()))
    a = prune.L1Unstructured(amount).compute_mask(t, fw.ns.ones_like(t))
    b = prune.L1Unstructured(amount).compute_mask(t.clone(), fw.ns.ones_like(t))
    assert fw.equal(a, b)
