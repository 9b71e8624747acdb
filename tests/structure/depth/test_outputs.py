"""structure.depth.outputs: remove_blocks' check runs the model without its key/value cache,
adding use_cache=False only where the forward takes it by that name."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from prunekit.structure.depth.outputs import outputs_of

X = torch.ones(2, 3)


class Recording(nn.Module):
    """Records the use_cache its forward is given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[object] = []

    def forward(self, x: torch.Tensor, use_cache: bool = True) -> torch.Tensor:
        self.seen.append(use_cache)
        return x * 2


class PositionalOnly(nn.Module):
    """use_cache before '/': given by keyword, Python refuses it."""

    def forward(self, use_cache: bool = True, /, *, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Absorbing(nn.Module):
    """**kwargs, no use_cache: a keyword it never asked for would be passed on."""

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        assert not kwargs, kwargs
        return x * 2


def test_use_cache_is_turned_off_where_the_forward_names_it() -> None:
    model = Recording()
    assert torch.equal(outputs_of(model, {"x": X})[0], X * 2)
    assert model.seen == [False]


def test_a_positional_only_use_cache_is_not_given_by_keyword() -> None:
    """Read as 'takes use_cache' (its name was among the parameters): the check called the
    forward with use_cache=False and failed with Python's TypeError."""
    assert torch.equal(outputs_of(PositionalOnly(), {"x": X})[0], X * 2)


def test_kwargs_alone_are_not_given_use_cache() -> None:
    assert torch.equal(outputs_of(Absorbing(), {"x": X})[0], X * 2)


def test_a_forward_behind_accelerate_hooks_still_runs_without_its_cache() -> None:
    hooks = pytest.importorskip("accelerate.hooks")
    model = Recording()
    hooks.add_hook_to_module(model, hooks.ModelHook())
    outputs_of(model, {"x": X})
    assert model.seen == [False]
