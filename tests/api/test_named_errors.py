"""Errors that name what the caller must fix: the calibrated layer by its path in the
model, the example inputs by the entry point that traced them, the loss by the entry point
whose calibration it serves."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from hostile.support import refused


class Reused(nn.Module):
    """`inner.a` run twice in one forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.inner.a = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.inner.a
        return self.head(a(torch.relu(a(x))))


class Shares(nn.Module):
    """`left` and `right` read one tensor in a batch of 3 rows, two tensors in any other."""

    def __init__(self) -> None:
        super().__init__()
        self.left, self.right = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        other = x if x.shape[0] == 3 else x.clone()
        return self.left(x) + self.right(other)


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_layer_called_twice_is_named_by_its_path(method: str) -> None:
    torch.manual_seed(0)
    model = Reused()
    refused(
        lambda: prunekit.prune_model(model, 0.5, method=method, calibration=[torch.randn(3, 4)]),
        ValueError,
        r"^calibration: module 'inner\.a' \(Linear\) was called more than once per batch "
        r"\(the same module run on two inputs in one forward\); expected each calibrated "
        r"layer to run once per forward",
        model=model,
    )


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_layer_sharing_its_input_in_one_batch_only_is_named_by_its_path(method: str) -> None:
    torch.manual_seed(0)
    model = Shares()
    refused(
        lambda: prunekit.prune_model(
            model, 0.5, method=method, calibration=[torch.randn(3, 4), torch.randn(5, 4)]
        ),
        ValueError,
        r"^calibration: module 'right' \(Linear\) shared its input with another layer in the "
        r"first batch but not in this one; expected each batch to run the model the same way",
        model=model,
    )


class Widen(nn.Module):
    """A hidden width of 8 read by `down`, which runs twice."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        return self.down(h) + self.down(h * 2)


@pytest.mark.parametrize(
    "options",
    [{"criterion": "activation"}, {"compensate": True}],
    ids=["calibrated-criterion", "compensation"],
)
def test_prune_channels_names_a_layer_called_twice_by_its_path(options: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = Widen()
    x = torch.randn(6, 4)
    refused(
        lambda: prunekit.prune_channels(model, x, 0.5, calibration=[x], **options),
        ValueError,
        r"calibration: module 'down' \(Linear\) was called more than once per batch",
        model=model,
    )


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


ENTRIES: dict[str, Any] = {
    "prune_channels": lambda model, inputs: prunekit.prune_channels(model, inputs, 0.5),
    "channel_groups": prunekit.channel_groups,
    "compact": prunekit.compact,
}

WRONG: dict[str, tuple[Any, type[BaseException], str]] = {
    "features": (torch.randn(3, 5), RuntimeError, r"mat1 and mat2 shapes cannot be multiplied"),
    "dtype": (torch.ones(3, 4, dtype=torch.long), RuntimeError, r"mat1 and mat2 must have"),
    "keyword": ({"y": torch.randn(3, 4)}, TypeError, r"got an unexpected keyword argument 'y'"),
}


@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("wrong", list(WRONG))
def test_example_inputs_the_model_cannot_take_are_named_with_the_model_s_error(
    entry: str, wrong: str
) -> None:
    model = mlp()
    inputs, kind, said = WRONG[wrong]
    error = refused(
        lambda: ENTRIES[entry](model, inputs),
        ValueError,
        rf"^{entry}: the model cannot take example_inputs: {kind.__name__}: .*{said}.*; "
        r"expected example_inputs the model's forward accepts",
        model=model,
    )
    assert isinstance(error.__cause__, kind)


def test_the_model_s_own_error_on_example_inputs_is_named_so() -> None:
    class Picky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] < 2:
                raise ValueError("two rows at least")
            return self.a(x)

    model = Picky()
    error = refused(
        lambda: prunekit.channel_groups(model, torch.randn(1, 4)),
        ValueError,
        r"^channel_groups: the model cannot take example_inputs: ValueError: two rows at least",
        model=model,
    )
    assert isinstance(error.__cause__, ValueError)


def test_a_bug_in_a_graph_handler_is_not_blamed_on_the_example_inputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prunekit.structure.graph.tables import HANDLERS

    def broken(*args: Any) -> None:
        raise ZeroDivisionError("a bug in a handler")

    monkeypatch.setitem(HANDLERS.ops, "relu", broken)
    model = mlp()
    refused(
        lambda: prunekit.prune_channels(model, torch.randn(3, 4), 0.5),
        ZeroDivisionError,
        "a bug in a handler",
        model=model,
    )


def test_a_bug_in_the_tracer_s_hooks_is_not_blamed_on_the_example_inputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prunekit.structure.trace import tracer

    def broken(*args: Any) -> None:
        raise ZeroDivisionError("a bug in an op's inputs")

    monkeypatch.setattr(tracer, "_inputs", broken)
    model = mlp()
    refused(
        lambda: prunekit.channel_groups(model, torch.randn(3, 4)),
        ZeroDivisionError,
        "a bug in an op's inputs",
        model=model,
    )


LOSSES: dict[str, tuple[Any, str]] = {
    "not-a-scalar": (
        lambda output, batch: output,
        r"calibration: loss\(output, batch\) returned a tensor of shape \(3, 2\) on batch 0; "
        r"expected loss to return a scalar floating tensor",
    ),
    "not-finite": (
        lambda output, batch: output.sum() * float("nan"),
        r"calibration: loss\(output, batch\) is nan on batch 0, with finite parameters and "
        r"inputs; expected a finite loss",
    ),
    "raises": (
        lambda output, batch: output["labels"],
        r"calibration: the loss raised on batch 0: IndexError: .*; expected loss\(output, "
        r"batch\) to return a scalar tensor",
    ),
}


@pytest.mark.parametrize("case", list(LOSSES))
@pytest.mark.parametrize("entry", ["prune_model", "prune_channels"])
def test_a_loss_that_fails_is_named_with_the_entry_point(entry: str, case: str) -> None:
    model = mlp()
    x = torch.randn(3, 4)
    loss, said = LOSSES[case]
    if entry == "prune_model":
        call = lambda: prunekit.prune_model(  # noqa: E731
            model, 0.5, method="taylor", calibration=[x], loss=loss
        )
    else:
        call = lambda: prunekit.prune_channels(  # noqa: E731
            model, x, 0.5, criterion="taylor", calibration=[x], loss=loss
        )
    refused(call, ValueError, rf"^{entry}: {said}", model=model)


def test_an_error_of_the_tracer_itself_is_not_blamed_on_the_example_inputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A TypeError raised in prunekit's code before the model is called (one of its
    functions called with the wrong arguments; no frame of the test's in between)."""
    from prunekit.structure.trace import tracer

    monkeypatch.setattr(tracer, "tensor_owners", tracer.compressed)
    refused(
        lambda: prunekit.channel_groups(mlp(), torch.randn(3, 4)),
        TypeError,
        r"^compressed\(\) takes 1 positional argument but 2 were given$",
    )


class Stack(nn.Module):
    """Two residual blocks of 8 features in a ModuleList, then a head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)) for _ in range(2)
        )
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


CALIBRATED: dict[str, tuple[str, Any]] = {
    "wanda": ("prune_model", lambda m, xs: prunekit.prune_model(
        m, 0.5, method="wanda", calibration=xs, sequential=False)),
    "sparsegpt-sequential": ("prune_model", lambda m, xs: prunekit.prune_model(
        m, 0.5, method="sparsegpt", calibration=xs, sequential=True)),
    "taylor": ("prune_model", lambda m, xs: prunekit.prune_model(
        m, 0.5, method="taylor", calibration=xs, loss=lambda out, _: out.sum())),
    "activation": ("prune_channels", lambda m, xs: prunekit.prune_channels(
        m, xs[0], 0.25, criterion="activation", calibration=xs)),
    "compensate": ("prune_channels", lambda m, xs: prunekit.prune_channels(
        m, xs[0], 0.25, calibration=xs, compensate=True)),
    "reference": ("prune_channels", lambda m, xs: prunekit.prune_channels(
        m, xs[0], 0.25, calibration=xs, compensate="reference")),
    "reconstruct": ("reconstruct_blocks", lambda m, xs: prunekit.reconstruct_blocks(
        m, Stack(), xs, steps=1)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CALIBRATED))
def test_a_batch_the_model_cannot_take_is_named_with_the_entry_point(case: str) -> None:
    """The error names what the user called, then the batch and the model's own error; it
    started with 'calibration:', whichever entry point it was."""
    entry, call = CALIBRATED[case]
    model = Stack()
    xs = [torch.randn(3, 8), torch.randn(3, 5)]  # batch 1 has the wrong width
    error = refused(
        lambda: call(model, xs),
        ValueError,
        rf"^{entry}: calibration: the model cannot take batch 1: RuntimeError: .*; expected "
        r"batches the model's forward accepts$",
        model=model,
    )
    assert isinstance(error.__cause__, RuntimeError)
