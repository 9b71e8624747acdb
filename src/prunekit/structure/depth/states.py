"""Hidden states at the blocks' boundaries over calibration batches, and the tokens to count.

One batch at a time: each block's input and output hidden state are caught by forward hooks
during one forward of the whole model, used, and dropped before the next batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.calibrate import run_batch
from prunekit.core.errors import is_explained, type_error, value_error
from prunekit.core.example_inputs import token_mask as shared_token_mask
from prunekit.structure.depth.blocks import ADDS, REPLACES, BlockList, hidden_in, hidden_out

__all__ = [
    "Boundaries",
    "boundaries",
    "check_inputs",
    "check_tokens",
    "rows",
    "run_boundaries",
    "run_one",
    "token_mask",
]


class Boundaries:
    """Each block's input and output hidden state for one batch (None: the block did not run)."""

    def __init__(self, count: int) -> None:
        self.inputs: list[Tensor | None] = [None] * count
        self.outputs: list[Tensor | None] = [None] * count


@contextmanager
def boundaries(blocks: BlockList, owner: str, style: str = REPLACES) -> Iterator[Boundaries]:
    """Hooks that fill a ``Boundaries`` with the hidden state each block takes and the one
    after it (detached): its output, or (`style` ADDS: the parent adds the output) the sum."""
    found = Boundaries(len(blocks))
    handles = []

    def catch(index: int) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            before, after = hidden_in(args, kwargs), hidden_out(output)
            if before is None or after is None or before.shape != after.shape:
                raise value_error(
                    f"{owner}: cannot tell the hidden state of {blocks.path(index)} "
                    f"({type(module).__name__}); expected a tensor as its first argument (or "
                    "hidden_states=) and as its output (or the output's first element), of "
                    "one shape"
                )
            found.inputs[index] = before.detach()
            found.outputs[index] = (after + before if style == ADDS else after).detach()

        return hook

    for index, block in enumerate(blocks.modules):
        handles.append(block.register_forward_hook(catch(index), with_kwargs=True))
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


def run_one(model: nn.Module, batch: Any, index: int, owner: str) -> Any:
    """``run_batch``; an error of the model's forward names the batch it could not take."""
    try:
        return run_batch(model, batch)
    except Exception as error:
        if is_explained(error):
            raise
        raise value_error(
            f"{owner}: the model cannot take calibration batch {index}: "
            f"{type(error).__name__}: {error}; expected batches its forward accepts"
        ) from error


def run_boundaries(model: nn.Module, blocks: BlockList, batch: Any, index: int, owner: str,
                   style: str = REPLACES) -> Boundaries:  # fmt: skip
    """Run `batch` (number `index`) through `model` (no grad); every block's hidden states."""
    with boundaries(blocks, owner, style) as found, torch.no_grad():
        run_one(model, batch, index, owner)
    for index, seen in enumerate(found.inputs):
        if seen is None:
            raise value_error(
                f"{owner}: {blocks.path(index)} did not run on a calibration batch; expected "
                "a model whose forward calls every block"
            )
    return found


def token_mask(
    batch: Any, index: int, owner: str, hidden: Tensor, model: nn.Module
) -> Tensor | None:
    """Which tokens of `hidden` (a block's hidden state for calibration batch `index`)
    count: True where the batch's ``attention_mask`` (a tuple's by `model`'s forward's
    names) is nonzero, on `hidden`'s device; None: every one (no mask).

    Raises:
        ValueError: the mask is not shaped like the batch's ``input_ids``
            (``core.example_inputs.token_mask``), or `hidden` is not one row per token
            (``(*mask.shape, features)``, or the tokens flattened): which row is a masked
            token could not be told.
    """
    kept = shared_token_mask(batch, index, owner, model)
    if kept is None:
        return None
    if tuple(hidden.shape[:-1]) != tuple(kept.shape) and hidden.shape[:-1].numel() != kept.numel():
        raise value_error(
            f"{owner}: calibration batch {index} has an attention_mask of shape "
            f"{tuple(kept.shape)}, but the blocks' hidden states are of shape "
            f"{tuple(hidden.shape)}; expected hidden states of one row per token "
            "(the mask's shape and the features), or a batch without attention_mask"
        )
    return kept.to(device=hidden.device)


def rows(hidden: Tensor, mask: Tensor | None) -> Tensor:
    """The hidden state as one row per counted token, in float64."""
    flat = hidden.reshape(-1, hidden.shape[-1]).to(dtype=torch.float64)
    return flat if mask is None else flat[mask.reshape(-1)]


def check_tokens(batches: list[Any], owner: str, model: nn.Module) -> None:
    """Refuse calibration batches whose ``attention_mask`` (a tuple's by `model`'s
    forward's names) keeps no token at all: there is nothing to score blocks (or fit a
    map) on; or a mask not shaped like its batch's ``input_ids``
    (``core.example_inputs.token_mask``)."""
    masks = [shared_token_mask(batch, index, owner, model) for index, batch in enumerate(batches)]
    if all(isinstance(m, Tensor) for m in masks) and not any(
        bool((m != 0).any()) for m in masks if isinstance(m, Tensor)
    ):
        raise value_error(
            f"{owner}: every attention_mask of the {len(batches)} calibration batches is all "
            "zero, so there is no token to score the blocks on; expected batches whose "
            "attention_mask keeps at least one token"
        )


def check_inputs(inputs: Any, owner: str) -> None:
    """Refuse `example_inputs` of a kind no forward is called with (None: none given)."""
    if inputs is not None and not isinstance(inputs, Tensor | Mapping | tuple | list):
        raise type_error(
            f"{owner}: invalid example_inputs of type {type(inputs).__name__}; expected a "
            "tensor, a mapping of keyword arguments or a tuple of positional arguments for "
            "the model"
        )
    values = inputs.values() if isinstance(inputs, Mapping) else \
        inputs if isinstance(inputs, tuple | list) else [inputs]  # fmt: skip
    for value in values:
        if isinstance(value, Tensor) and (value.is_meta or value.layout != torch.strided):
            kind = "on the meta device (no values)" if value.is_meta else f"{value.layout}"
            raise value_error(
                f"{owner}: example_inputs holds a tensor {kind}; expected dense tensors with "
                "values, on which the outputs are compared"
            )
