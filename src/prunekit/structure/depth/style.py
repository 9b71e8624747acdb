"""Which residual style a list of blocks follows: whether its parent takes each block's
output as the new hidden state (``h = block(h)``) or adds it (``h = h + block(h)``).

A skipped block must contribute nothing, so it gives back its input in the first style and
zeros in the second. The style is found by running the model on example inputs twice with
the first block skipped each way: the way under which the second block receives exactly
what the first one received is the parent's. Where neither (or both) does, as where the
parent does more between the blocks (a norm, a scale, an injection), skipping is not
removing and is refused. Hugging Face's layers return the residual stream (the first
style); any other block list needs example inputs to tell.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from prunekit.calibrate import evaluating, run_batch
from prunekit.core.errors import is_explained, value_error
from prunekit.structure.depth.blocks import (
    ADDS,
    REPLACES,
    BlockList,
    hidden_in,
    skip,
    skipped,
    unskip,
)

__all__ = ["residual_style", "style_for"]


def style_for(model: nn.Module, found: BlockList, inputs: Any, owner: str,
              what: str = "the example inputs") -> str:  # fmt: skip
    """The style of `found`'s parent: that of a block skipped already, else found on
    `inputs` (example inputs of the model) where given, else the first one for Hugging
    Face's layers; refused otherwise."""
    for block in found.modules:
        held = skipped(block)
        if held is not None:
            return held.style
    if inputs is not None:
        return residual_style(model, found, inputs, owner, what)
    if all(type(b).__module__.startswith("transformers.") for b in found.modules):
        return REPLACES
    raise value_error(
        f"{owner}: cannot tell whether the parent of {found.name} takes each block's output "
        "as the new hidden state (h = block(h)) or adds it to the hidden state "
        "(h = h + block(h)), and a skipped block must contribute nothing in either; expected "
        "example_inputs= (inputs the model's forward takes) to find out"
    )


def residual_style(model: nn.Module, found: BlockList, inputs: Any, owner: str,
                   what: str = "the example inputs") -> str:  # fmt: skip
    """The style under which the second block of `found` receives exactly what the first
    received while the first is skipped, on `inputs`; refused where not exactly one does."""
    matches = [s for s in (REPLACES, ADDS) if _passes(model, found, inputs, s, owner, what)]
    if len(matches) != 1:
        why = "both ways (its hidden state is zero)" if matches else "neither way"
        raise value_error(
            f"{owner}: skipping {found.path(0)} (its output replaced by its input, or by "
            f"zeros) passes its input on to {found.path(1)} {why} on {what}, so "
            f"the parent of {found.name} does more between its blocks than h = block(h) or "
            "h = h + block(h), and a skipped block would not be a removed one; expected "
            "blocks whose parent does one of those"
        )
    return matches[0]


def _passes(model: nn.Module, found: BlockList, inputs: Any, style: str, owner: str,
            what: str) -> bool:  # fmt: skip
    first, second = found.modules[0], found.modules[1]
    caught: dict[str, Tensor | None] = {}

    def on_first(module: nn.Module, args: Any, kwargs: Any) -> None:
        caught.setdefault("first", hidden_in(args, kwargs))

    def on_second(module: nn.Module, args: Any, kwargs: Any) -> None:
        caught.setdefault("second", hidden_in(args, kwargs))

    handles = [
        first.register_forward_pre_hook(on_first, with_kwargs=True),
        second.register_forward_pre_hook(on_second, with_kwargs=True),
    ]
    skip(first, style)
    try:
        with evaluating(model), torch.no_grad():
            run_batch(model, inputs)
    except Exception as error:
        if is_explained(error):
            raise
        raise value_error(
            f"{owner}: the model cannot take {what}: {type(error).__name__}: "
            f"{error}; expected inputs its forward accepts"
        ) from error
    finally:
        unskip(first)
        for handle in handles:
            handle.remove()
    a, b = caught.get("first"), caught.get("second")
    return a is not None and b is not None and a.shape == b.shape and torch.equal(a, b)
