"""What a model's forward is given: one name for the types every entry point takes.

``ExampleInputs``: a tensor (one positional argument), a tuple or list of positional
arguments, or a mapping of keyword arguments, as ``channel_groups``, ``prune_channels``,
``compact`` and the depth calls trace and run them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

from torch import Tensor

__all__ = ["ExampleInputs"]

ExampleInputs: TypeAlias = Tensor | Sequence[object] | Mapping[str, object]
"""A forward's inputs: a tensor, a tuple (or list) of positional arguments, or a mapping of
keyword arguments."""
