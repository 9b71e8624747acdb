"""What a model's forward is given: one name for the types every entry point takes.

``ExampleInputs``: a tensor (one positional argument), a tuple or list of positional
arguments, or a mapping of keyword arguments, as ``channel_groups``, ``prune_channels``,
``compact`` and the depth calls trace and run them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

from torch import Tensor

__all__ = ["ExampleInputs", "rowless"]

ExampleInputs: TypeAlias = Tensor | Sequence[object] | Mapping[str, object]
"""A forward's inputs: a tensor, a tuple (or list) of positional arguments, or a mapping of
keyword arguments."""


def rowless(batches: Sequence[object]) -> str | None:
    """Why no batch of `batches` holds a row (a sample, a token) a calibration can use.

    Args:
        batches: each a tensor, a tuple or list of positional arguments, or a mapping of
            keyword arguments (its first value is the one looked at).

    Returns:
        ``'is empty'`` (every batch's first tensor has no entry), ``'has an attention_mask
        that is all zero'`` (every batch masks out every token), or None where some batch
        has a row.
    """
    if all(isinstance(t, Tensor) and t.numel() == 0 for t in map(_first, batches)):
        return "is empty"
    masks = [b.get("attention_mask") if isinstance(b, Mapping) else None for b in batches]
    if all(isinstance(m, Tensor) and not bool((m != 0).any()) for m in masks):
        return "has an attention_mask that is all zero"
    return None


def _first(batch: object) -> object:
    """A batch's first input: a mapping's first value, a tuple's or list's first item, or
    the batch itself."""
    if isinstance(batch, Mapping):
        return next(iter(batch.values()), None)
    if isinstance(batch, tuple | list):
        return batch[0] if batch else None
    return batch
