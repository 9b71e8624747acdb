"""Ranks as threads: a Group whose collectives meet at a barrier, for tests of code that runs
over a process group, in milliseconds and in one process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from prunekit.distributed.collectives import Group


class ThreadGroup(Group):
    """One of `size` threads; each collective waits for all of them."""

    def __init__(self, rank: int, size: int, shared: dict[str, Any]) -> None:
        self.rank, self.size, self.shared = rank, size, shared

    def _all(self, value: Any) -> list[Any]:
        slots, barrier = self.shared["slots"], self.shared["barrier"]
        slots[self.rank] = value
        barrier.wait()
        found = list(slots)
        barrier.wait()
        return found

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return torch.stack(self._all(values.clone())).sum(0)

    def gather(self, values: torch.Tensor) -> list[torch.Tensor]:
        return self._all(values.clone())

    def objects(self, value: Any) -> list[Any]:
        return self._all(value)

    def first(self, values: torch.Tensor) -> torch.Tensor:
        return self._all(values.clone())[0].clone()


def on_threads(size: int, run: Callable[[Group], Any]) -> list[Any]:
    """`run(group)` on `size` threads, one rank each; their results by rank."""
    shared = {"slots": [None] * size, "barrier": threading.Barrier(size, timeout=60)}
    results: list[Any] = [None] * size
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            results[rank] = run(ThreadGroup(rank, size, shared))
        except BaseException as error:
            errors.append(error)
            shared["barrier"].abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
