"""What a model's forward is given: one name for the types every entry point takes.

``ExampleInputs``: a tensor (one positional argument), a tuple or list of positional
arguments, or a mapping of keyword arguments, as ``channel_groups``, ``prune_channels``,
``compact`` and the depth calls trace and run them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from torch import Tensor

__all__ = ["ExampleInputs", "rowless"]

ExampleInputs: TypeAlias = Tensor | Sequence[object] | Mapping[str, object]
"""A forward's inputs: a tensor, a tuple (or list) of positional arguments, or a mapping of
keyword arguments."""


def rowless(batches: Sequence[Any]) -> str | None:
    """Why no batch of `batches` holds a row (a sample, a token) a calibration can use.

    Args:
        batches: each a tensor, a tuple or list of positional arguments, or a mapping of
            keyword arguments (its first value is the one looked at).

    Returns:
        ``'is empty'`` (every batch's first tensor has no entry), ``'has an attention_mask
        that is all zero'`` (every batch masks out every token), or None where some batch
        has a row.
    """
    firsts = [next(iter(b.values()), None) if isinstance(b, Mapping) else
              b[0] if isinstance(b, tuple | list) and b else b for b in batches]  # fmt: skip
    if all(isinstance(t, Tensor) and t.numel() == 0 for t in firsts):
        return "is empty"
    masks = [b.get("attention_mask") if isinstance(b, Mapping) else None for b in batches]
    if all(isinstance(m, Tensor) and not bool((m != 0).any()) for m in masks):
        return "has an attention_mask that is all zero"
    return None
