"""What an attention adapter reads off a module: its projections, head counts and the
parameters that follow its heads (shared by ``attention`` and ``mha``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["Adapter", "Follow", "Heads", "Proj", "first"]


@dataclass(frozen=True)
class Proj:
    """A projection: ``module.<weight>`` (rows along `out_dim`), from row `offset` of a
    fused weight; `op` says how the weight is applied ('linear' or Conv1D's 'addmm')."""

    module: nn.Module
    weight: str = "weight"
    bias: str | None = "bias"
    out_dim: int = 0
    offset: int = 0
    op: str = "linear"
    bias_offset: int | None = None  # where the bias rows start, if not at `offset`


@dataclass(frozen=True)
class Follow:
    """A per-channel parameter inside the attention that follows the query (`side` 'q') or
    key (`side` 'k') heads along `dim`: per row of the projection (`per_head` False; with
    `whole` True it is a norm's weight over the whole projected width, whose statistics then
    exclude the masked heads) or one entry per head (`per_head` True)."""

    module: nn.Module
    weight: str
    side: str
    per_head: bool = False
    whole: bool = False


@dataclass(frozen=True)
class Heads:
    """What an adapter reads off one call of an attention module."""

    q: Proj
    k: Proj
    v: Proj
    o: Proj | None  # None: the module returns the heads, a consumer projects them
    heads: int
    kv_heads: int
    head_dim: int
    inputs: tuple[Any, Any, Any]  # the tensors the query, key and value projections read
    out: Any  # the tensor carrying o's output (or the heads when o is None)
    follows: tuple[Follow, ...] = ()


@dataclass(frozen=True)
class Adapter:
    """`read(module, args, kwargs, out)` -> Heads, or why the module is not understood;
    `sync(module)` sets its head counts and widths from its tensors (after compaction) and
    returns them: (heads, key/value heads, head_dim, hidden width it reads)."""

    read: Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], Heads | str]
    sync: Callable[[nn.Module], tuple[int, int, int, int]]


def first(out: Any) -> Any:
    """The first output of a module that returns a tuple or list, else its output."""
    return out[0] if isinstance(out, (tuple, list)) else out
