"""The collectives of prunekit's calls across processes, over torch.distributed or none.

They implement prunekit.select's Group protocol (sum, gather, objects) and add a
broadcast. `Group` is one process: every collective returns what it is given (select's
`Alone`, with a timeout). `TorchGroup` runs the same calls over a torch.distributed process
group (gloo, NCCL, ...). Tensors travel on the group's device (CUDA for NCCL) and come back
on the CPU.

No collective waits for the other ranks longer than the group's `timeout` (`TIMEOUT`
seconds unless given): past it, or when the backend reports a peer gone, the call raises
`RanksTimeout` naming the call, instead of blocking for the process group's own timeout
(30 minutes by default). The wait is for the others to arrive: set a larger timeout
where the ranks' work between two collectives can differ by more (very unequal
calibration batches, say). After a timeout the group is out of step (the collective is
still pending on the ranks that arrived): destroy it and make a new one.
"""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from prunekit.core.errors import type_error, value_error
from prunekit.select.process_group import Alone

__all__ = ["TIMEOUT", "Group", "RanksTimeout", "TorchGroup", "group_of"]

TIMEOUT = 60.0
"""Seconds a rank waits at one collective for the others, unless its group says otherwise."""


class RanksTimeout(RuntimeError):
    """A collective did not complete within the group's timeout (or a peer is gone)."""


class Group(Alone):
    """A group of one process (sums and gathers are the identity), with the timeout and
    the broadcast every prunekit call over ranks uses: the base of TorchGroup, and what
    prunekit.select's selection calls run over (its Group protocol)."""

    timeout = TIMEOUT

    def first(self, values: Tensor) -> Tensor:
        """Rank 0's `values` (same shape and dtype on every rank)."""
        return values


class TorchGroup(Group):
    """The ranks of a torch.distributed process group as prunekit's collective calls use
    them, each wait bounded by `timeout` seconds.

    Pass one as `process_group` to any prunekit call to choose the bound; a plain
    torch.distributed group (or None, the default group) gets `TIMEOUT` seconds.

    Args:
        process_group: a torch.distributed process group; None is the default group.
        timeout: seconds a rank waits at one collective for the others (> 0, finite).

    Raises:
        TypeError: `timeout` is not a number.
        ValueError: `timeout` is not finite and > 0, or torch.distributed is not
            initialized.
    """

    def __init__(self, process_group: Any = None, *, timeout: float = TIMEOUT) -> None:
        _check_timeout(timeout)
        if not (dist.is_available() and dist.is_initialized()):
            raise value_error(
                f"prunekit: process_group={process_group!r} needs torch.distributed "
                "initialized; expected torch.distributed.init_process_group() first"
            )
        self._dist = dist
        self.group = process_group
        self.timeout = float(timeout)
        self.rank = dist.get_rank(process_group)
        self.size = dist.get_world_size(process_group)
        backend = str(dist.get_backend(process_group))
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )

    def _wait(self, work: Any, what: str) -> None:
        """Wait for `work` at most the timeout; a backend failure or the timeout raises."""
        try:
            work.wait(timeout=timedelta(seconds=self.timeout))
        except RuntimeError as error:
            raise RanksTimeout(
                f"rank {self.rank} of {self.size} waited for the other ranks at a collective "
                f"({what}) and it did not complete ({type(error).__name__}: {error}): a rank "
                f"died, never made this call, or took longer than the timeout of "
                f"{self.timeout:g} s (TorchGroup(group, timeout=...) sets it). The group is "
                "out of step now: destroy it and make a new one"
            ) from error

    def sum(self, values: Tensor) -> Tensor:
        out = values.to(self.device, copy=True)
        self._wait(self._dist.all_reduce(out, group=self.group, async_op=True), "all_reduce")
        return out.cpu()

    def gather(self, values: Tensor) -> list[Tensor]:
        sizes = self.sum(_one_hot(self.rank, self.size, values.numel())).tolist()
        width = max(sizes)
        if width == 0:  # nothing anywhere: no collective (some backends refuse empty ones)
            return [values.reshape(-1)[:0].cpu() for _ in range(self.size)]
        padded = torch.zeros(width, dtype=values.dtype, device=self.device)
        padded[: values.numel()] = values.reshape(-1)
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        work = self._dist.all_gather(parts, padded, group=self.group, async_op=True)
        self._wait(work, "all_gather")
        return [part[:n].cpu() for part, n in zip(parts, sizes, strict=True)]

    def objects(self, value: Any) -> list[Any]:
        data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
        return [pickle.loads(bytes(part.numpy())) for part in self.gather(data)]

    def first(self, values: Tensor) -> Tensor:
        out = values.to(self.device, copy=True)
        source = self._dist.get_global_rank(self.group, 0) if self.group is not None else 0
        work = self._dist.broadcast(out, src=source, group=self.group, async_op=True)
        self._wait(work, "broadcast")
        return out.cpu()


def group_of(process_group: Any, owner: str = "prunekit") -> Group:
    """The Group for a torch.distributed process group (None: the default group, waits
    bounded by TIMEOUT); a Group is returned as it is. Raises ValueError, naming `owner`,
    if torch.distributed is not initialized."""
    if isinstance(process_group, Group):
        return process_group
    if not (dist.is_available() and dist.is_initialized()):
        raise value_error(
            f"{owner}: process_group={process_group!r} needs torch.distributed initialized; "
            "expected torch.distributed.init_process_group() first"
        )
    return TorchGroup(process_group)


def _check_timeout(timeout: Any) -> None:
    number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
    if not number:
        raise type_error(
            f"TorchGroup: invalid timeout={timeout!r}; expected a number of seconds > 0"
        )
    if not (0 < timeout < float("inf")):  # NaN fails too
        raise value_error(
            f"TorchGroup: invalid timeout={timeout!r}; expected a finite number of seconds > 0"
        )


def _one_hot(rank: int, size: int, value: int) -> Tensor:
    hot = torch.zeros(size, dtype=torch.int64)
    hot[rank] = value
    return hot
