"""The fast path's reader: the sources a chunk at a time, into work buffers reused throughout.

Working in chunks keeps every intermediate small (and in cache): only the
selections themselves take memory the size of a tensor. In the tensor
operations, comparisons write 0/1 floats (several times faster here than bools,
and summed to count), and entries that do not compete read as NaN, which every
comparison leaves out: no branch, no masked write.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from prunekit.select import native, tuning
from prunekit.select.strategy import Route

__all__ = ["Chunks", "ones", "write"]

_ONE = torch.ones(())  # 1 - chosen = kept


class Chunks:
    """Reads the sources a chunk at a time into work buffers reused from chunk to chunk."""

    def __init__(self, plan: Route) -> None:
        self.plan = plan
        now = tuning.get()
        self.chunk = now.chunk
        size = min(now.chunk, plan.largest)
        self.between = torch.empty(size, dtype=torch.bool)
        self.values = torch.empty(size, dtype=plan.work)
        # 0/1 as floats: compares write floats several times faster than bools here.
        self.low = torch.empty(size, dtype=plan.work)
        self.high = torch.empty(size, dtype=plan.work)
        self.alive = torch.empty(size, dtype=plan.work)
        self.zeros = torch.zeros(size, dtype=plan.work)
        # The C loop's: 16-bit scores widened, other flags as bools. Only the pages
        # written are ever mapped.
        self.step = now.step
        step = min(now.step, plan.largest) if native.loaded() else 0
        self.wide = torch.empty(step if plan.bits == 16 else 0, dtype=plan.work)
        self.live = torch.empty(step, dtype=torch.bool)

    def read(
        self, scores: Tensor, alive: Tensor | None, step: int | None = None
    ) -> Iterator[tuple[int, Tensor, Tensor | None]]:
        """(start, scores, alive flags or None) for each chunk (of `step` entries,
        `tuning.chunk` by default) of one source's scores."""
        step = step or self.chunk
        flat = scores.detach().reshape(-1)
        live = None if alive is None else alive.reshape(-1)
        for start in range(0, flat.numel(), step):
            part = flat[start : start + step]
            if part.dtype != self.plan.dtype:
                part = part.to(self.plan.dtype)
            flags = None if live is None else live[start : start + step]
            yield start, part.contiguous(), flags

    def magnitudes(
        self, scores: Tensor, alive: Tensor | None, out: Tensor, window: bool = False
    ) -> Iterator[tuple[int, Tensor, Tensor, int]]:
        """(start, the chunk's slice of `out`, its |scores| (signed route: its scores), how
        many compete) per chunk; with `window`, `out` is a chunk's room, reused: the slice
        is its start.

        Entries that do not compete read as NaN, so every comparison leaves them out.

        The magnitudes are written into the slice of `out` itself when `out` has the
        dtype they are compared in (callers then overwrite them with the selection),
        else into a buffer.
        """
        for start, part, flags in self.read(scores, alive):
            n = part.numel()
            piece = out[:n] if window else out[start : start + n]
            magnitudes = piece if out.dtype == self.plan.work else self.values[:n]
            if self.plan.signed:
                magnitudes.copy_(part)  # widened, if at all: exact
            elif part.dtype == magnitudes.dtype:
                torch.abs(part, out=magnitudes)
            else:
                magnitudes.copy_(part).abs_()  # widened: exact
            if flags is None:
                live_count = n
            else:
                # |x| + 0 / alive: |x| + 0/1 (exact) where alive, |x| + 0/0 = NaN where not.
                # Branch-free, unlike masked_fill_ or where() on scattered flags.
                live = self.alive[:n]
                if flags.dtype == torch.bool:
                    live.copy_(flags)
                elif flags.dtype != live.dtype and _widens(flags.dtype, live.dtype):
                    torch.eq(live.copy_(flags), 1, out=live)  # faster than mixed dtypes
                else:
                    torch.eq(flags, 1, out=live)
                magnitudes.addcdiv_(self.zeros[:n], live)
                live_count = ones(live)
            yield start, piece, magnitudes, live_count


def _widens(source: torch.dtype, target: torch.dtype) -> bool:
    """True if `source` is a float type that `target` holds exactly (so == 1 is kept)."""
    return source.is_floating_point and torch.promote_types(source, target) == target


def ones(flags: Tensor) -> int:
    """How many 1s a chunk of 0/1 floats holds (float32 sums are exact that far)."""
    return int(flags.sum(dtype=torch.float32))


def write(piece: Tensor, chosen: Tensor, hit: bool) -> None:
    """Write 0/1 floats `chosen` into `piece`: as they are (`hit`), or as 1 - chosen."""
    if hit:
        piece.copy_(chosen)
    elif piece.dtype == chosen.dtype:
        torch.sub(_ONE, chosen, out=piece)
    else:
        piece.copy_(torch.sub(_ONE, chosen, out=chosen))  # faster than mixed dtypes
