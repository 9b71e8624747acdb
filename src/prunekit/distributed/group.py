"""The few collectives a selection across processes needs, over torch.distributed or none.

`Group` is one process: every collective returns what it is given. `TorchGroup` runs the
same calls over a torch.distributed process group (gloo, NCCL, ...). Tensors travel on
the group's device (CUDA for NCCL) and come back on the CPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from prunekit.core.errors import value_error

__all__ = ["Group", "TorchGroup", "group_of"]


class Group:
    """A group of one process: sums and gathers are the identity."""

    rank = 0
    size = 1

    def sum(self, values: Tensor) -> Tensor:
        """`values` (a 1-D int64 or float64 tensor) summed over the ranks."""
        return values

    def gather(self, values: Tensor) -> list[Tensor]:
        """Every rank's 1-D `values` (any length per rank), in rank order."""
        return [values]

    def objects(self, value: Any) -> list[Any]:
        """Every rank's picklable `value`, in rank order."""
        return [value]

    def first(self, values: Tensor) -> Tensor:
        """Rank 0's `values` (same shape and dtype on every rank)."""
        return values


class TorchGroup(Group):
    """The collectives over a torch.distributed process group (None: the default group)."""

    def __init__(self, process_group: Any = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.size = dist.get_world_size(process_group)
        backend = str(dist.get_backend(process_group))
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )

    def sum(self, values: Tensor) -> Tensor:
        out = values.to(self.device, copy=True)
        self._dist.all_reduce(out, group=self.group)
        return out.cpu()

    def gather(self, values: Tensor) -> list[Tensor]:
        sizes = self.sum(_one_hot(self.rank, self.size, values.numel())).tolist()
        width = max(sizes)
        if width == 0:  # nothing anywhere: no collective (some backends refuse empty ones)
            return [values.reshape(-1)[:0].cpu() for _ in range(self.size)]
        padded = torch.zeros(width, dtype=values.dtype, device=self.device)
        padded[: values.numel()] = values.reshape(-1)
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        self._dist.all_gather(parts, padded, group=self.group)
        return [part[:n].cpu() for part, n in zip(parts, sizes, strict=True)]

    def objects(self, value: Any) -> list[Any]:
        found: list[Any] = [None] * self.size
        self._dist.all_gather_object(found, value, group=self.group)
        return found

    def first(self, values: Tensor) -> Tensor:
        out = values.to(self.device, copy=True)
        source = self._dist.get_global_rank(self.group, 0) if self.group is not None else 0
        self._dist.broadcast(out, src=source, group=self.group)
        return out.cpu()


def group_of(process_group: Any, owner: str = "prunekit") -> Group:
    """The Group for a torch.distributed process group (None: the default group); a Group
    is returned as it is. Raises ValueError, naming `owner`, if torch.distributed is not
    initialized."""
    if isinstance(process_group, Group):
        return process_group
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise value_error(
            f"{owner}: process_group={process_group!r} needs torch.distributed initialized; "
            "expected torch.distributed.init_process_group() first"
        )
    return TorchGroup(process_group)


def _one_hot(rank: int, size: int, value: int) -> Tensor:
    hot = torch.zeros(size, dtype=torch.int64)
    hot[rank] = value
    return hot
