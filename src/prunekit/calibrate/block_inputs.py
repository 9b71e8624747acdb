"""A model's blocks: found, their inputs captured once, and each run to give the next one's
inputs (key/value caches left out)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from prunekit.calibrate.batches import batch_error, run_batch
from prunekit.calibrate.statistics import Stop
from prunekit.core.errors import value_error

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


"""The positional and keyword arguments one block was called with, for one batch."""


_CACHES = ("past_key_value", "past_key_values", "layer_past")


def block_list(model: nn.Module, owners: Sequence[nn.Module]) -> tuple[str, nn.ModuleList] | None:
    """The model's sequence of blocks: the ModuleList of two or more modules of one class
    that holds the most of `owners` (the modules to prune); None if none holds any."""
    wanted = {id(m) for m in owners}
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        held = sum(1 for child in module for sub in child.modules() if id(sub) in wanted)
        if held and (best is None or held > best[0]):
            best = (held, name, module)
    return None if best is None else (best[1], best[2])


def cacheless(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A block's keyword arguments without its key/value cache, so it can run again."""
    kwargs = dict(kwargs)
    for key in _CACHES:
        if key in kwargs:
            kwargs[key] = None
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    return kwargs


def _cache_positions(module: nn.Module) -> set[int]:
    """The positions at which `module`'s forward takes a key/value cache (GPT-2's blocks
    take ``past_key_values`` second): a cache given there is dropped as one by keyword."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # no signature to read
        return set()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    found: set[int] = set()
    for index, param in enumerate(params):
        if param.kind not in positional:
            break
        if param.name in _CACHES:
            found.add(index)
    return found


def capture_block_inputs(
    model: nn.Module, block: nn.Module, batches: Sequence[Any]
) -> list[Inputs]:
    """Run the model on each batch up to `block` and keep what `block` was called with
    (caches dropped); nothing after the block runs."""
    captured: list[Inputs] = []

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        cached = _cache_positions(module)
        args = tuple(None if i in cached else a for i, a in enumerate(args))
        captured.append((args, cacheless(kwargs)))
        raise Stop

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for index, batch in enumerate(batches):
            try:
                run_batch(model, batch)
            except Stop:
                continue
            except Exception as error:
                raise batch_error(index, error)  # noqa: B904 (the cause is set on a new error)
            raise value_error(
                f"calibration: batch {index} ran the model's forward without reaching its "
                f"blocks ({type(block).__name__}); expected a model that calls them"
            )
    finally:
        handle.remove()
    return captured


_SEQUENTIAL = " (or pass sequential=False)"
"""What run_block's refusals end with: a calibrated call can run the whole model instead."""


def run_block(block: nn.Module, inputs: Inputs) -> Inputs:
    """Call `block` and return the inputs of the next one: the same arguments with the
    hidden states (the first positional one, or ``hidden_states=``) replaced."""
    args, kwargs = inputs
    out = block(*args, **kwargs)
    hidden = out[0] if isinstance(out, tuple | list) and out else out
    if not isinstance(hidden, Tensor):
        shown = f"a {type(out).__name__}"
        if out is not hidden:
            shown += f" starting with a {type(hidden).__name__}"
        raise value_error(
            f"calibration: {type(block).__name__} returned {shown}, whose hidden states the "
            "next block cannot be given; expected a tensor (or a tuple or list starting with "
            f"one){_SEQUENTIAL}"
        )
    return with_hidden(inputs, hidden, block, "calibration", _SEQUENTIAL)


def with_hidden(
    inputs: Inputs, hidden: Tensor, block: nn.Module, owner: str, hint: str = ""
) -> Inputs:
    """`inputs` (those `block` was called with) with the hidden states (the first
    positional argument, or ``hidden_states=``) replaced by `hidden`: the next block's.

    Raises:
        ValueError: `block` takes neither, so its hidden states cannot be told (the
            message starts with `owner` and ends with `hint`).
    """
    args, kwargs = inputs
    if args:
        return (hidden, *args[1:]), kwargs
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": hidden}
    raise value_error(
        f"{owner}: cannot tell which argument of {type(block).__name__} carries the hidden "
        f"states; expected a first positional argument or hidden_states={hint}"
    )


def next_inputs(block: nn.Module, inputs: Sequence[Inputs]) -> list[Inputs]:
    """`block`'s outputs for each batch, as the next block's inputs."""
    found = []
    for index, one in enumerate(inputs):
        try:
            found.append(run_block(block, one))
        except Exception as error:
            raise batch_error(index, error)  # noqa: B904 (the cause is set on a new error)
    return found
