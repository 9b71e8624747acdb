"""register_op_handler, register_module_handler: one's own ops and modules in the channel graph."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint
from prunekit.structure.graph.tables import HANDLERS


@pytest.fixture(autouse=True)
def registries_restored() -> Iterator[None]:
    """Every test leaves the process-wide registries exactly as it found them."""
    handlers, modules = dict(HANDLERS.ops), list(HANDLERS.modules)
    yield
    assert handlers == HANDLERS.ops
    assert modules == HANDLERS.modules


class Swish(nn.Module):
    """x * sigmoid(x) through an op the graph has no handler for."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.special.expit(x)


class Transposed(nn.Module):
    """A linear layer of its own: weight (out, in), applied through einsum."""

    def __init__(self, features: int, out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out, features) / features**0.5)
        self.bias = nn.Parameter(torch.randn(out))

    def forward(self, x: Tensor) -> Tensor:
        return torch.einsum("...i,oi->...o", x, self.weight) + self.bias


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad * 2


class Net(nn.Module):
    def __init__(self, middle: nn.Module | None = None) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.act = Swish()
        self.mid = middle if middle is not None else nn.Linear(16, 12)
        self.b = nn.Linear(12, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(torch.relu(self.mid(self.act(self.a(x)))))


def reasons(model: nn.Module, x: Tensor) -> dict[str, str | None]:
    return {g.name: g.reason for g in prunekit.channel_groups(model, x)}


def roundtrip(model: nn.Module, x: Tensor) -> None:
    """Prune half, compact; the compacted model computes what the masked one did."""
    prunekit.prune_channels(model, x, 0.5)
    with torch.no_grad():
        masked = model(x)
    prunekit.compact(model, x, latency_runs=0)
    with torch.no_grad():
        compacted = model(x)
    assert float((compacted - masked).abs().max()) <= 1e-5 * float(masked.abs().max())


def test_elementwise_op_lets_the_channels_through_until_removed() -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(5, 8)
    before = reasons(model, x)
    assert "special_expit (in act) is not an op the graph knows" in str(before["a.weight"])
    with prunekit.register_op_handler(torch.special.expit, "elementwise"):
        assert reasons(model, x)["a.weight"] is None
        roundtrip(model, x)
    assert model.a.out_features == 8 and model.mid.in_features == 8
    assert model.mid.out_features == 6
    assert reasons(model, x)["a.weight"] == before["a.weight"]  # removed: blocked again


def test_op_registered_by_name_and_raw_handler() -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(5, 8)
    seen: list[str] = []

    def passes(tracer: Any, call: Any) -> None:
        seen.append(call.where)
        tracer.set(call.out, tracer.label(call.arg(0, "input")))

    registration = prunekit.register_op_handler("special_expit", passes)
    try:
        assert reasons(model, x)["a.weight"] is None
        roundtrip(model, x)
    finally:
        registration.remove()
    registration.remove()  # a second remove does nothing
    assert seen and set(seen) == {"act"}


def test_blocked_op_over_a_builtin_needs_replace_and_is_restored() -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(5, 8)
    relu = HANDLERS.ops["relu"]
    with pytest.raises(ValueError, match=r"register_op_handler: op='relu' has a handler alr"):
        prunekit.register_op_handler(torch.relu, "blocked")
    with prunekit.register_op_handler(torch.relu, "blocked", replace=True):
        assert "relu (in Net) is registered as blocking them" in str(
            reasons(model, x)["mid.weight"]
        )
    assert HANDLERS.ops["relu"] is relu
    assert reasons(model, x)["mid.weight"] is None


def test_module_handler_linear_for_a_weight_of_its_own() -> None:
    torch.manual_seed(0)
    model, x = Net(Transposed(16, 12)), torch.randn(5, 8)
    before = reasons(model, x)
    assert "einsum (in mid) contracts over them" in str(before["a.weight"])
    assert "mid.weight" not in before  # its output channels are no group at all
    with (
        prunekit.register_op_handler(torch.special.expit, "elementwise"),
        prunekit.register_module_handler(Transposed, "linear"),
    ):
        after = reasons(model, x)
        assert after["a.weight"] is None and after["mid.weight"] is None
        roundtrip(model, x)
    assert tuple(model.mid.weight.shape) == (6, 8) and tuple(model.mid.bias.shape) == (6,)
    assert tuple(model.a.weight.shape) == (8, 8) and model.b.in_features == 6


def test_module_handler_elementwise_and_blocked() -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(5, 8)
    with prunekit.register_module_handler(Swish, "elementwise"):
        assert reasons(model, x)["a.weight"] is None
        with prunekit.register_module_handler(Swish, "blocked", replace=True):
            assert "Swish (in act) is registered as blocking them" in str(
                reasons(model, x)["a.weight"]
            )
        assert reasons(model, x)["a.weight"] is None  # the first registration is back
        roundtrip(model, x)
    assert model.a.out_features == 8


def test_linear_module_that_does_not_fit_is_blocked() -> None:
    class Wrong(nn.Module):  # weight (in, out): not the layout "linear" means
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(16, 12))

        def forward(self, x: Tensor) -> Tensor:
            return x @ self.weight

    torch.manual_seed(0)
    model, x = Net(Wrong()), torch.randn(5, 8)
    with (
        prunekit.register_op_handler(torch.special.expit, "elementwise"),
        prunekit.register_module_handler(Wrong, "linear"),
    ):
        assert "registered as 'linear' but its weight" in str(reasons(model, x)["a.weight"])


def test_a_handler_that_raises_keeps_its_traceback_and_the_model() -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(5, 8)
    state = fingerprint(model)

    def broken(tracer: Any, call: Any) -> None:
        raise RuntimeError("a bug in the handler")

    with (
        prunekit.register_op_handler(torch.special.expit, broken),
        pytest.raises(RuntimeError, match=r"^a bug in the handler$") as caught,
    ):
        prunekit.prune_channels(model, x, 0.5)
    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert frames[-1] == "broken"
    assert fingerprint(model) == state


@pytest.mark.parametrize(
    ("op", "handler", "kwargs", "error", "match"),
    [
        (torch.special.expit, 3, {}, TypeError, r"register_op_handler: invalid handler=3 of "
         r"type int; expected 'elementwise', 'blocked' or a callable"),
        (torch.special.expit, "linear", {}, ValueError, r"register_op_handler: invalid "
         r"handler='linear'; expected one of 'elementwise', 'blocked'"),
        (42, "elementwise", {}, TypeError, r"register_op_handler: invalid op=42 of type int; "
         r"expected a torch function"),
        (nn.Linear, "elementwise", {}, TypeError, r"invalid op=.*Linear.* of type type; .*"
         r"module class goes to prunekit.register_module_handler"),
        ("", "elementwise", {}, ValueError, r"register_op_handler: invalid op=''"),
        ("x.y", "elementwise", {}, ValueError, r"register_op_handler: invalid op='x.y'"),
        ("size", "elementwise", {}, ValueError, r"invalid op='size'; 'size' returns metadata"),
        (Double.apply, "elementwise", {}, TypeError, r"register_op_handler: invalid op=.*; the "
         r"graph sees the torch ops inside a custom autograd Function, never its apply"),
        (torch.add, "elementwise", {}, ValueError, r"op='add' has a handler already; pass "
         r"replace=True"),
        (torch.special.expit, "blocked", {"replace": 1}, TypeError, r"register_op_handler: "
         r"invalid replace=1; expected True or False"),
    ],
)  # fmt: skip
def test_register_op_handler_refuses(
    op: Any, handler: Any, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        prunekit.register_op_handler(op, handler, **kwargs)


@pytest.mark.parametrize(
    ("cls", "handler", "kwargs", "error", "match"),
    [
        (Swish(), "elementwise", {}, TypeError, r"register_module_handler: invalid "
         r"module_class of type Swish; expected an nn.Module subclass"),
        (int, "elementwise", {}, TypeError, r"invalid module_class of type <class 'int'>"),
        (Swish, None, {}, TypeError, r"register_module_handler: invalid handler=None of type "
         r"NoneType; expected 'elementwise', 'blocked', 'linear' or a callable"),
        (Swish, "conv", {}, ValueError, r"register_module_handler: invalid handler='conv'; "
         r"expected one of 'elementwise', 'blocked', 'linear'"),
        (nn.Linear, "linear", {}, ValueError, r"register_module_handler: module_class=Linear "
         r"is traced already; pass replace=True"),
        (Swish, "blocked", {"replace": "yes"}, TypeError, r"register_module_handler: invalid "
         r"replace='yes'; expected True or False"),
    ],
)  # fmt: skip
def test_register_module_handler_refuses(
    cls: Any, handler: Any, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        prunekit.register_module_handler(cls, handler, **kwargs)


def test_a_class_registered_twice_needs_replace() -> None:
    with prunekit.register_module_handler(Swish, "elementwise"):
        modules = list(HANDLERS.modules)
        with pytest.raises(ValueError, match=r"module_class=Swish has a handler already"):
            prunekit.register_module_handler(Swish, "blocked")
        assert modules == HANDLERS.modules
