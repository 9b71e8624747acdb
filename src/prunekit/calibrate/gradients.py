"""Gradients for Taylor: the targets made to require grad, the loss of the model's output,
and the gradients summed over the calibration batches."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.calibrate.batches import (
    _check_finite_loss,
    _check_loss,
    batch_error,
    evaluating,
    run_batch,
)
from prunekit.core.errors import value_error
from prunekit.core.naming import stored_parameter


def gradients(
    model: nn.Module,
    batches: Sequence[Any],
    params: Sequence[tuple[nn.Parameter, Callable[[], Tensor]]],
    loss: Callable[[Any, Any], Tensor],
    step: Callable[[int, Tensor, Tensor], None],
    *,
    owner: str,
    end_batch: Callable[[], None] | None = None,
) -> None:
    """Backward of `loss` for each batch; for each of `params` (a Parameter and a function
    giving the tensor it stands for), ``step(i, values, grad)``, then ``end_batch()``.
    Only `params` get gradients; every requires_grad flag and .grad is as before
    afterwards. An error of a batch or of the loss names `owner`, the entry point calibrating."""
    wanted = [p for p, _ in params]
    with requiring_grad(model, wanted, restore_grads=True), evaluating(model), torch.enable_grad():
        for index, batch in enumerate(batches):
            try:
                output = run_batch(model, batch)
            except Exception as error:
                raise batch_error(index, error, owner=owner)  # noqa: B904 (its cause is set)
            try:
                value = loss(output, batch)
            except Exception as error:
                raise batch_error(index, error, owner=owner, what="loss")  # noqa: B904 (cause set)
            _check_loss(value, index, owner)
            _check_finite_loss(value, index, model, batch, owner)
            value.backward()  # type: ignore[no-untyped-call]
            for i, (p, current) in enumerate(params):
                if p.grad is not None:
                    step(i, current().detach(), p.grad)
                p.grad = None
            if end_batch is not None:
                end_batch()


@contextmanager
def requiring_grad(
    model: nn.Module, params: Iterable[nn.Parameter], *, restore_grads: bool = False
) -> Iterator[None]:
    """Only `params` require grad while entered: no other parameter of `model` does (no
    graph is built through them). Every flag is put back on exit, after an error too.

    With `restore_grads`, `params` also start with no ``.grad``, and every ``.grad`` (of
    `model`'s parameters and of `params`) is put back on exit as it was on entry."""
    wanted = list(params)
    chosen = {id(p) for p in wanted}
    every = list({id(p): p for p in (*model.parameters(), *wanted)}.values())
    saved = [(p, p.requires_grad, p.grad) for p in every]
    try:
        for p in every:
            p.requires_grad_(id(p) in chosen)
            if restore_grads and id(p) in chosen:
                p.grad = None
        yield
    finally:
        for p, flag, grad in saved:
            p.requires_grad_(flag)
            if restore_grads:
                p.grad = grad


def parameter(module: nn.Module, name: str) -> nn.Parameter:
    """The Parameter behind ``module.<name>``, whose gradient `gradients` takes:
    ``<name>_orig`` where pruned."""
    path, _, leaf = name.rpartition(".")  # a dotted name: a submodule's (an out_proj's)
    param = stored_parameter(module.get_submodule(path) if path else module, leaf)
    assert param is not None, f"{type(module).__name__} has no parameter {name}"
    return param


def gradient_targets(
    targets: Iterable[tuple[nn.Module, str]],
) -> list[tuple[nn.Parameter, Callable[[], Tensor]]]:
    """What `gradients` takes for the tensors ``module.<name>``: the Parameter behind each
    and a function giving the tensor as the model computes with it (masked where pruned)."""
    return [(parameter(module, name), _reader(module, name)) for module, name in targets]


def _reader(module: nn.Module, name: str) -> Callable[[], Tensor]:
    path, _, leaf = name.rpartition(".")  # a dotted name: a submodule's (an out_proj's)

    def read() -> Tensor:
        value: Tensor = getattr(module.get_submodule(path) if path else module, leaf)
        return value

    return read


def output_loss(owner: str, argument: str) -> Callable[[Any, Any], Tensor]:
    """The loss `gradients` takes when the caller gives none: the model output's ``.loss``.
    Its error names `owner` and its `argument` (such as ``method='taylor'``)."""

    def loss(output: Any, batch: Any) -> Tensor:
        value = getattr(output, "loss", None)
        if not isinstance(value, Tensor):
            raise value_error(
                f"{owner}: {argument} needs a loss and the model's output has no .loss; "
                "expected loss=lambda output, batch: <a scalar tensor>"
            )
        return value

    return loss
