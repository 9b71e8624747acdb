"""core.signature: what a forward takes, read once for every caller (recover's refusal of a
hidden-state term, remove_blocks' use_cache=False, the cache positions of calibration, the
ONNX input names), through **kwargs, positional-only parameters and wrapped forwards."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from prunekit.core.signature import forward_parameters, takes_keyword


class Named(nn.Module):
    def forward(self, x: torch.Tensor, use_cache: bool = True) -> torch.Tensor:
        return x


class KeywordOnly(nn.Module):
    def forward(self, x: torch.Tensor, *, use_cache: bool = True) -> torch.Tensor:
        return x


class Absorbing(nn.Module):
    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return x


class PositionalOnly(nn.Module):
    def forward(self, use_cache: bool = True, /, *, x: torch.Tensor) -> torch.Tensor:
        return x


class PositionalOnlyAbsorbing(nn.Module):
    def forward(self, use_cache: bool = True, /, **kwargs: Any) -> Any:
        return kwargs


class Without(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (Named(), True),
        (KeywordOnly(), True),
        (Absorbing(), None),  # may take it: neither added nor refused
        (PositionalOnly(), False),  # use_cache=... by keyword is a TypeError
        (PositionalOnlyAbsorbing(), None),  # by keyword it lands in **kwargs
        (Without(), False),
    ],
    ids=["named", "keyword-only", "kwargs", "positional-only", "positional-only-kwargs", "none"],
)
def test_a_keyword_is_taken_by_name_maybe_or_not(module: nn.Module, expected: bool | None) -> None:
    assert takes_keyword(module, "use_cache") is expected


def _logged(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    return wrapper


def _bare(forward: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    return wrapper


class Decorated(nn.Module):
    @_logged
    def forward(self, x: torch.Tensor, use_cache: bool = True) -> torch.Tensor:
        return x


class DecoratedBare(nn.Module):
    @_bare
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_a_forward_wrapped_with_functools_wraps_is_read_through_its_wrapper() -> None:
    assert takes_keyword(Decorated(), "use_cache") is True
    assert takes_keyword(Decorated(), "output_hidden_states") is False
    found = forward_parameters(Decorated())
    assert found is not None and [p.name for p in found] == ["x", "use_cache"]
    # without functools.wraps only (*args, **kwargs) can be read: not known either way
    assert takes_keyword(DecoratedBare(), "use_cache") is None


class Unreadable:
    """A callable whose signature inspect cannot read (a broken ``__signature__``)."""

    __signature__ = "not a signature"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return None


def test_a_forward_put_on_the_instance_is_the_one_read() -> None:
    module = Without()
    module.forward = functools.partial(Named.forward, Named())  # type: ignore[method-assign]
    assert takes_keyword(module, "use_cache") is True
    module.forward = Unreadable()  # type: ignore[method-assign]
    assert forward_parameters(module) is None
    assert takes_keyword(module, "use_cache") is None


def test_accelerate_hooks_replacing_forward_show_the_forward_they_wrap() -> None:
    hooks = pytest.importorskip("accelerate.hooks")
    for module, expected in ((Named(), True), (Without(), False), (Absorbing(), None)):
        hooks.add_hook_to_module(module, hooks.ModelHook())
        assert "forward" in vars(module)  # the hook's partial stands in for the forward
        assert takes_keyword(module, "use_cache") is expected
        assert torch.equal(module(torch.ones(2)), torch.ones(2))
