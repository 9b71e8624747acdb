"""Every number the selection kernels are tuned by, in one place, and the way to change them.

The kernels read the values at call time through :func:`get`, so a change made
with :func:`overridden` applies from the next call on::

    from prunekit.select import tuning

    with tuning.overridden(small=0, chunk=64, threads=lambda: 3):
        ...  # small inputs take the fast path, in chunks of 64, on three threads

An override holds for the code running in the current context (thread or task)
until its ``with`` block ends; overrides nest. Tests use it to run every path on
small inputs; nothing else needs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MOST_THREADS", "Tuning", "get", "overridden", "threads_for", "torch_threads"]

MOST_THREADS = 2**31 - 1
"""The largest thread count torch takes (it holds the count in a C int)."""


@dataclass(frozen=True)
class Tuning:
    """The tuning of the selection kernels (the defaults were measured on a 2-core x86 CPU)."""

    chunk: int = 1 << 18
    """Entries read at a time by the tensor operations: their work buffers stay in cache (L2)."""
    step: int = 1 << 20
    """Entries per call of the C loop, which blocks them itself (fewer calls: faster)."""
    part: int = 1 << 19
    """The C loop splits a step (and the settling of the entries in between) among threads in
    parts at least this large: the thread count of a call follows its size. A part is worth
    a thread's wake-up on a quiet machine, and on a loaded one (where a thread may wait for a
    time slice) the caller takes the parts no other thread began (native.share)."""
    threads: Callable[[], int] = torch.get_num_threads
    """How many threads the C loop may use: as many as torch, by default."""
    one_thread: int = 1 << 22
    """A tensor of fewer entries is pruned on one thread (see :func:`threads_for`)."""
    native: bool = True
    """Whether the one pass runs as the C loop where it is built (else: tensor operations)."""
    small: int = 1 << 16
    """Up to this many entries in all, the portable path's few plain calls beat the passes."""
    tiny: int = 1 << 10
    """Up to this many entries compete, one stable sort beats kthvalue and its compares."""
    sample: int = 1 << 17
    """Entries sampled to guess where the k-th value lies."""
    guess: int = 1 << 18
    """From this many entries on, a sample is a fraction of them: worth taking."""
    spread: float = 6.0
    """How many standard deviations of the guess the bounds leave either side."""
    gather_share: int = 16
    """The one pass gathers at most 1/gather_share of all entries between its bounds..."""
    gather_capped: bool = True
    """...and, if capped, no more memory (a position and a value each) than the largest tensor."""
    portable_chunk: int = 1 << 20
    """Entries the portable path reads at a time (small tensors share one), and the most it
    gathers to rank apart: its work memory beyond the selections."""


# A frozen dataclass: the default is never changed, only replaced.
_CURRENT: ContextVar[Tuning] = ContextVar("prunekit_select_tuning", default=Tuning())  # noqa: B039
_NAMES = frozenset(field.name for field in dataclasses.fields(Tuning))


def get() -> Tuning:
    """The tuning in force here and now."""
    return _CURRENT.get()


@contextmanager
def overridden(**changes: Any) -> Iterator[Tuning]:
    """Run the ``with`` block under the current tuning with `changes` made (field=value)."""
    unknown = sorted(set(changes) - _NAMES)
    if unknown:
        raise TypeError(
            f"tuning.overridden: unknown names {unknown}; expected some of {sorted(_NAMES)}"
        )
    tuning = dataclasses.replace(_CURRENT.get(), **changes)
    token = _CURRENT.set(tuning)
    try:
        yield tuning
    finally:
        _CURRENT.reset(token)


@contextmanager
def torch_threads(count: int) -> Iterator[int]:
    """Run the ``with`` block with torch's intra-op thread count set to `count`, and set it
    back to what it was on leaving the block, whether the block returns or raises.

    torch is only asked to change its count where it differs. Blocks nest: each restores
    the count it found, also where the block itself changed it. The count is the process's,
    not the context's: two threads that each hold a block at once leave the count of the
    block that ends last.

    Args:
        count: the thread count inside the block, from 1 to ``MOST_THREADS``.

    Returns:
        A context manager; ``with`` binds the count it found (the one restored on exit).

    Raises:
        TypeError: `count` is not an int.
        ValueError: `count` is below 1 or above ``MOST_THREADS``.
    """
    if not isinstance(count, int) or isinstance(count, bool):
        raise TypeError(
            f"tuning.torch_threads: count={count!r} of type {type(count).__name__}; "
            f"expected an int of at least 1 and at most {MOST_THREADS}"
        )
    if not 1 <= count <= MOST_THREADS:
        raise ValueError(
            f"tuning.torch_threads: count={count}; expected an int of at least 1 and at most "
            f"{MOST_THREADS} (torch holds the count in a C int)"
        )
    found = torch.get_num_threads()
    if count != found:
        torch.set_num_threads(count)
    try:
        yield found
    finally:
        if torch.get_num_threads() != found:  # set back, also if the block changed it
            torch.set_num_threads(found)


def threads_for(entries: int | None) -> AbstractContextManager[int]:
    """Run the ``with`` block on one torch thread when it prunes a torch tensor of fewer than
    `one_thread` entries; on torch's threads otherwise (`entries` None: not a torch tensor).

    A pruning is a few dozen tensor operations. Below about four million entries a second
    thread saves little on a quiet machine (ResNet-18's shapes: 0.113 s on one thread, 0.128 s
    on two), and on a machine whose other core is busy every operation waits for it to get a
    time slice (0.134 s against 0.319 s).

    Args:
        entries: how many entries the tensor pruned has, or None (not a torch tensor).

    Returns:
        A :func:`torch_threads` block: torch's count restored on leaving it.
    """
    small = entries is not None and entries < get().one_thread
    return torch_threads(1 if small else torch.get_num_threads())
