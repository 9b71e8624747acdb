"""The few collectives a selection over several processes needs, and the group of one process.

The selection in pieces (pieces.py) sums counts and histograms over the ranks, gathers a
sample and exchanges a few small objects; `Group` names those calls. `Alone` is one
process: every collective returns what it is given, so the same selection runs in one
process with no collective at all. prunekit.distributed implements the calls over
torch.distributed (TorchGroup), each wait bounded.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor

__all__ = ["Alone", "Group"]


class Group(Protocol):
    """The ranks a selection runs over: this process's rank, how many, their collectives."""

    rank: int
    size: int

    def sum(self, values: Tensor) -> Tensor:
        """`values` (a 1-D int64 or float64 tensor) summed over the ranks."""
        ...

    def gather(self, values: Tensor) -> list[Tensor]:
        """Every rank's 1-D `values` (any length per rank), in rank order."""
        ...

    def objects(self, value: Any) -> list[Any]:
        """Every rank's picklable `value`, in rank order."""
        ...


class Alone:
    """A group of one process: sums and gathers are the identity."""

    rank = 0
    size = 1

    def sum(self, values: Tensor) -> Tensor:
        """`values` as they are: the sum over one rank."""
        return values

    def gather(self, values: Tensor) -> list[Tensor]:
        """[`values`]: the one rank's."""
        return [values]

    def objects(self, value: Any) -> list[Any]:
        """[`value`]: the one rank's."""
        return [value]
