"""Calibration batches: run through the model, checked, and an error in one named by its index
(and told apart from an error of prunekit's own hooks)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import CodeType
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core import nested
from prunekit.core.checks import check_kind
from prunekit.core.errors import type_error, value_error


def run_batch(model: nn.Module, batch: Any) -> Any:
    """``model(batch)`` for a tensor, ``model(**batch)`` for a mapping (a tokenizer's output),
    ``model(*batch)`` for a tuple or list."""
    if isinstance(batch, Tensor):
        return model(batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, tuple | list):
        return model(*batch)
    raise type_error(
        f"calibration: invalid batch of type {type(batch).__name__}; expected a tensor, a "
        "mapping of keyword arguments or a tuple of positional arguments for the model"
    )


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Run the block with every submodule in eval mode (no dropout); modes restored after."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode


def _check_loss(value: Any, index: int, owner: str) -> None:
    """Raise unless `value`, what the caller's loss returned on batch `index`, is a tensor
    a gradient can flow back from: one floating element, computed from the model. The
    error names `owner`, the entry point whose calibration it is."""
    if not isinstance(value, Tensor):
        found = f"a {type(value).__name__} ({value!r:.60})"
    elif value.numel() != 1:
        found = f"a tensor of shape {tuple(value.shape)}"
    elif not value.is_floating_point():
        found = f"a tensor of dtype {value.dtype}"
    elif not value.requires_grad:
        found = "a tensor that does not require grad (detached, or not computed from the output)"
    elif value.is_meta:
        found = "a meta tensor (a shape without a value)"
    else:
        return
    raise value_error(
        f"{owner}: calibration: loss(output, batch) returned {found} on batch {index}; expected "
        "loss to return a scalar floating tensor that requires grad (computed from the "
        "model's output)"
    )


def _check_finite_loss(value: Tensor, index: int, model: nn.Module, batch: Any, owner: str) -> None:
    """Raise if the loss on batch `index` is NaN or infinite while the model's parameters and
    the batch are finite (a complex value when both its parts are: the rule of
    core.nested.first_not_finite, which recover's check of a batch follows too): the loss is
    then the cause, and its gradients would make every score unrankable. Where they are not
    finite, the scores' own check names the tensor. The error names `owner`."""
    if bool(torch.isfinite(value.detach()).all()):
        return
    params = [p for p in model.parameters() if nested.is_numeric(p)]
    finite = all(bool(torch.isfinite(p.detach()).all()) for p in params)
    if finite and nested.first_not_finite(batch) is None:
        raise value_error(
            f"{owner}: calibration: loss(output, batch) is {float(value.detach())} on batch "
            f"{index}, "
            "with finite parameters and inputs; expected a finite loss (its gradients would "
            "make every score unrankable)"
        )


def batch_error(index: int, error: Exception, *, owner: str, what: str = "model") -> Exception:
    """The error to raise for `error`, met on batch `index`: an error prunekit explained
    already, or one raised in prunekit's own code (a bug, not the caller's), as it is;
    else the caller's `what` ('model' or 'loss') is named as the one that failed, after
    `owner` (the entry point whose calibration it is: what the user called)."""
    if not is_callers(error):
        return error
    if what == "loss":
        found = value_error(
            f"{owner}: calibration: the loss raised on batch {index}: {type(error).__name__}: "
            f"{error}; expected loss(output, batch) to return a scalar tensor"
        )
    else:
        found = value_error(
            f"{owner}: calibration: the model cannot take batch {index}: "
            f"{type(error).__name__}: {error}; expected batches the model's forward accepts"
        )
    found.__cause__ = error
    return found


def example_error(owner: str, error: Exception) -> Exception:
    """The error to raise for `error`, met running the model on `owner`'s example_inputs
    (a trace of its forward): as ``batch_error`` decides, an error prunekit explained
    already or one raised in prunekit's own code (a bug) as it is; else the caller's model
    is named as the one that failed, `error` the cause. An error that never left
    prunekit's code (raised before the model was called, or after it returned) is
    prunekit's too."""
    if not is_callers(error) or not _entered_other_code(error):
        return error
    found = value_error(
        f"{owner}: the model cannot take example_inputs: {type(error).__name__}: {error}; "
        "expected example_inputs the model's forward accepts"
    )
    found.__cause__ = error
    return found


def is_callers(error: BaseException) -> bool:
    """Whether `error`, met running the caller's model, is the caller's to be told of in
    words of the caller's input: neither explained by prunekit already nor raised in
    prunekit's own code inside the model's call (a hook of prunekit's: a bug, kept as it is)."""
    return not (getattr(error, "_prunekit_explained", False) or _raised_by_prunekit(error))


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


_THROUGH: set[CodeType] = set()


"""The code of prunekit's functions that stand in a model's own call and call on into the
model (a wrapped forward): an error passing through them is not prunekit's."""


def calls_back(function: Callable[..., Any]) -> None:
    """Mark `function` as standing in the model's call and calling on into it: an error
    raised further in (by the model) is the model's, not prunekit's."""
    _THROUGH.add(function.__code__)


_OPS: set[CodeType] = set()


"""The code of prunekit's functions that run one op the model called, as it called it (a
torch function mode handing the op on to torch): an error raised in them is the op's."""


def runs_op(function: Callable[..., Any]) -> None:
    """Mark `function` as running one op of the model's, and nothing else: an error raised
    in it (by torch, on the model's own arguments) is the model's, not prunekit's, and so
    is one passing through the code that called it there."""
    _OPS.add(function.__code__)


def _entered_other_code(error: BaseException) -> bool:
    """Whether the traceback of `error` reaches code other than prunekit's (the model's,
    torch's), or the model's op (`runs_op`): else prunekit's own code raised it."""
    trace = error.__traceback__
    while trace is not None:
        code = trace.tb_frame.f_code
        if code in _OPS or not os.path.abspath(code.co_filename).startswith(_PACKAGE):
            return True
        trace = trace.tb_next
    return False


def _raised_by_prunekit(error: BaseException) -> bool:
    """Whether `error` came from prunekit's own code run inside the model's call (a hook of
    prunekit's, torch calling back into it) rather than from the caller's model or loss."""
    left = False  # the traceback went from prunekit into other code (torch, the model)
    trace = error.__traceback__
    while trace is not None:
        code = trace.tb_frame.f_code
        further = trace.tb_next
        if code in _OPS or (further is not None and code in _THROUGH):
            trace = further  # passed through on its way into the model, or the model's op
            continue
        if further is not None and further.tb_frame.f_code in _OPS:
            trace = further  # handed the model's op on to torch
            continue
        ours = os.path.abspath(code.co_filename).startswith(_PACKAGE)
        if ours and left:
            return True
        left = left or not ours
        trace = trace.tb_next
    return False


def batch_list(calibration: Any, owner: str) -> list[Any]:
    """`calibration` as a list of batches; refused (the message names `owner`) unless it is
    a non-empty iterable other than a tensor, a mapping (one batch of keyword arguments: a
    tokenizer's output) or a string."""
    one = isinstance(calibration, Tensor | Mapping | str | bytes)  # one batch, or no batches
    if one or not isinstance(calibration, Iterable):
        raise type_error(
            f"{owner}: invalid calibration of type {type(calibration).__name__}; "
            "expected an iterable of batches (a list of tensors, say)"
        )
    batches = list(calibration)
    if not batches:
        raise value_error(f"{owner}: calibration holds no batch; expected at least one")
    for index, batch in enumerate(batches):
        _check_batch(batch, f"{owner}: calibration batch {index}")
    return batches


def _check_batch(batch: Any, where: str) -> None:
    """Refuse a tensor of a batch that holds no values (meta): a forward on it computes
    nothing that can be ranked. Looks into the batch as ``core.nested.leaves`` does."""
    for place, value in nested.leaves(batch):
        if isinstance(value, Tensor) and value.is_meta:
            check_kind(value, where, f"the tensor {place}".rstrip(), real=False)
