"""The output check of ``remove_blocks``: on example inputs, the model with the blocks
removed must compute what it computed with them skipped.

Both forwards run in eval mode without gradients, a Hugging Face model's without its
key/value cache (``use_cache=False`` where its forward takes it). Compared: each floating
tensor the model returns (itself, or the tensors of a tuple or mapping at its top level: a
Hugging Face output's loss and logits), within 1e-4 of the largest finite output, as
``core.difference`` compares them: a NaN on either side is a difference, an infinity at one
place on both sides is none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.calibrate import evaluating, run_batch
from prunekit.core.difference import largest_over
from prunekit.core.errors import is_explained, value_error
from prunekit.core.signature import takes_keyword

__all__ = ["TOLERANCE", "check_outputs", "outputs_of", "reference_outputs"]

TOLERANCE = 1e-4
_OWNER = "remove_blocks"


def reference_outputs(model: nn.Module, inputs: Any, *, explicit: bool) -> list[Tensor] | None:
    """The floating tensors `model` returns on `inputs` (None: no inputs, or inputs found by
    ``remove_blocks`` itself that the model cannot take; refused where the caller gave
    them and the model cannot take them)."""
    if inputs is None:
        return None
    try:
        return _run(model, inputs)
    except Exception as error:
        if not explicit:
            return None
        if is_explained(error):
            raise
        raise value_error(
            f"{_OWNER}: the model cannot take example_inputs: {type(error).__name__}: "
            f"{error}; expected inputs its forward accepts"
        ) from error


def check_outputs(model: nn.Module, inputs: Any, reference: list[Tensor] | None, path: str,
                  removed: tuple[int, ...]) -> tuple[float | None, float | None]:  # fmt: skip
    """The largest difference of `model`'s outputs on `inputs` from `reference`, and the
    largest reference output; refused (ValueError) beyond the tolerance. (None, None)
    without a reference."""
    if reference is None:
        return None, None
    where = f"with blocks {list(removed)} of {path} removed"
    try:
        outputs = _run(model, inputs)
    except Exception as error:
        raise value_error(
            f"{_OWNER}: the model {where} cannot run the example inputs it ran with them "
            f"skipped ({type(error).__name__}: {error}); the model and its config are unchanged"
        ) from error
    if len(outputs) != len(reference) or any(
        a.shape != b.shape for a, b in zip(outputs, reference, strict=False)
    ):  # fmt: skip
        raise value_error(
            f"{_OWNER}: the model {where} returns other outputs (shapes "
            f"{[tuple(t.shape) for t in outputs]}) than with them skipped "
            f"({[tuple(t.shape) for t in reference]}); the model and its config are unchanged"
        )
    diff, scale = largest_over(zip(reference, outputs, strict=True))
    if not diff <= TOLERANCE * scale:  # NaN is a difference
        raise value_error(
            f"{_OWNER}: the model {where} differs from the model with them skipped by "
            f"{diff:.3g} (largest output {scale:.3g}; tolerance {TOLERANCE:g} x that) on the "
            "example inputs: its forward does more with its blocks than h = block(h) or "
            "h = h + block(h) (an index, a count or a per-layer setting read at run time); "
            "expected blocks whose removal the skip computes; the model and its config are "
            "unchanged"
        )
    return diff, scale


def outputs_of(model: nn.Module, inputs: Any) -> list[Tensor]:
    """The floating tensors `model` returns on `inputs` (itself, or those of a tuple or
    mapping at the top of its output), run in eval mode without gradients or a key/value
    cache."""
    return _run(model, inputs)


def _run(model: nn.Module, inputs: Any) -> list[Tensor]:
    named = takes_keyword(model, "use_cache") is True  # never added where **kwargs may take it
    if isinstance(inputs, Mapping) and "use_cache" not in inputs and named:
        inputs = {**inputs, "use_cache": False}
    with evaluating(model), torch.no_grad():
        output = run_batch(model, inputs)
    if isinstance(output, Tensor):
        values: list[Any] = [output]
    elif isinstance(output, Mapping):
        values = list(output.values())
    elif isinstance(output, tuple | list):
        values = list(output)
    else:
        values = []
    return [v.detach() for v in values if isinstance(v, Tensor) and v.is_floating_point()]
