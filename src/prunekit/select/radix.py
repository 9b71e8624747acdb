"""The exact fallback of the fast path: the k-th smallest magnitude from histograms of bits.

A float's bits, read as 16-bit digits from the top, order non-negative floats
the same way as their values, so a ``bincount`` of the top digit finds the
bucket that holds the k-th value, the next digits are counted only inside that
bucket, and a last pass compares every magnitude with the k-th one. Ties are
resolved only where they straddle the k-th value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from prunekit.select import trace
from prunekit.select.chunks import Chunks, write
from prunekit.select.group import Alone, Group
from prunekit.select.plan import KEYS
from prunekit.select.ties import positions

__all__ = ["descend", "find", "find_cut", "mark", "pick", "top_digits"]

_TOP_BINS = 1 << 15  # the top digit without its sign bit
_LOW_BINS = 1 << 16
_DEAD = 0x7FFF  # top digit, sign cleared, of entries that do not compete: NaN in every format


@dataclass
class Cut:
    """The k-th smallest key, how many entries hold it, and how many of those are chosen."""

    key: int
    equal: int
    take: int


def find_cut(chunks: Chunks, k: int) -> Cut:
    """Locate the k-th smallest key, 16 bits at a time, with histograms only."""
    trace.note("radix")

    def parts() -> Iterator[tuple[Tensor, Tensor]]:
        for index in range(len(chunks.sources)):
            for _, part, top in _tops(chunks, index):
                yield part, top

    key, take, equal = find(parts, k, chunks.plan.bits, Alone())
    return Cut(key, equal, take)


def find(
    parts: Callable[[], Iterable[tuple[Tensor, Tensor]]], rank: int, bits: int, group: Group
) -> tuple[int, int, int]:
    """The `rank`-th smallest (1-based) magnitude of the floats `parts()` yields on all ranks
    of `group`, as its bits (see `descend`), from histograms summed over the ranks.

    `parts()` yields, a chunk at a time, (floats, top digits): contiguous floats of `bits`
    bits (their sign ignored) and `top_digits` of them, _DEAD where an entry does not
    compete (those may be left out instead).
    """
    sign_off = (1 << (bits - 1)) - 1
    key_dtype = KEYS[bits]

    def histogram(shift: int, prefix: int) -> Tensor:
        if shift == bits - 16:  # the top digit, of every entry
            hist = torch.zeros(_TOP_BINS, dtype=torch.int64)
            for _, top in parts():
                hist += torch.bincount(top, minlength=_TOP_BINS)
            return hist
        digit = prefix >> (bits - 32 - shift)  # the top digit found
        hist = torch.zeros(_LOW_BINS, dtype=torch.int64)
        for part, top in parts():
            keys = part.view(key_dtype)[top == digit] & sign_off
            keys = keys[(keys >> (shift + 16)) == prefix]
            hist += torch.bincount((keys >> shift) & 0xFFFF, minlength=_LOW_BINS)
        return hist

    return descend(bits, histogram, rank, group)


def descend(
    bits: int, histogram: Callable[[int, int], Tensor], rank: int, group: Group
) -> tuple[int, int, int]:
    """The `rank`-th smallest (1-based) of non-negative float keys of `bits` bits, 16 bits
    at a time from the top, with histograms summed over the ranks of `group`.

    `histogram(shift, prefix)` counts, on this rank, the 16-bit digit at `shift` of the
    keys whose bits above it are `prefix` (at the top: of every key). Returns the key, how
    many entries equal to it are among the `rank` smallest, and how many equal it in all.
    """
    prefix = equal = 0
    for shift in range(bits - 16, -1, -16):
        digit, rank, equal = pick(group.sum(histogram(shift, prefix)), rank)
        prefix = (prefix << 16) | digit
    return prefix, rank, equal


def top_digits(part: Tensor, out: Tensor | None = None) -> Tensor:
    """The top 16 bits of contiguous floats `part` (16, 32 or 64 bits each) without their
    sign, as int16: the digit the histograms start from (into `out` if given)."""
    step = part.element_size() // 2
    digits = part.view(torch.int16)[step - 1 :: step]  # little-endian: top digit last
    return torch.bitwise_and(digits, _DEAD, out=out) if out is not None else digits & _DEAD


def _tops(chunks: Chunks, index: int) -> Iterator[tuple[int, Tensor, Tensor]]:
    """(start, scores, top digits) per chunk of source `index`: the top 16 bits without
    the sign, _DEAD where the entry does not compete."""
    step = chunks.plan.bits // 16
    for start, part, flags in chunks.read(*chunks.sources[index]()):
        n = part.numel()
        top = chunks.top[:n]
        if flags is None:
            yield start, part, top_digits(part, top)
            continue
        digits = part.view(torch.int16)[step - 1 :: step]  # little-endian: top digit last
        dead = chunks.dead[:n]
        if flags.dtype == torch.bool:
            torch.logical_not(flags, out=dead)
        else:
            torch.ne(flags, 1, out=dead)
        # All bits set where dead (-1 as int8 widens to 0xFFFF), then the sign cleared:
        # _DEAD. Branch-free, unlike masked_fill_ on scattered flags.
        ones = torch.neg(dead.view(torch.int8), out=chunks.all_bits[:n])
        torch.bitwise_or(digits, ones, out=top)
        yield start, part, torch.bitwise_and(top, _DEAD, out=top)  # the sign cleared


def pick(hist: Tensor, rank: int) -> tuple[int, int, int]:
    """The bin holding the `rank`-th entry (1-based), that entry's rank within the bin,
    and the bin's count."""
    cum = hist.cumsum(0)
    index = int((cum < rank).count_nonzero())
    below = int(cum[index - 1]) if index else 0
    return index, rank - below, int(hist[index])


def mark(chunks: Chunks, cut: Cut, keep_dtype: torch.dtype | None) -> Iterator[Tensor]:
    """Yield each source's selection: keys below the cut, then the first `cut.take` equal ones.

    Compares magnitudes as floats against the float whose bits are the cut: for
    non-negative floats that is the same order as their bits.
    """
    plan = chunks.plan
    bound = torch.tensor([cut.key], dtype=plan.key).view(plan.dtype)[0]
    hit = keep_dtype is None
    out_dtype = torch.bool if keep_dtype is None else keep_dtype
    # With no ties at the cut the chosen are exactly the keys up to it.
    take = 0 if cut.take == cut.equal else cut.take
    below = torch.le if take == 0 else torch.lt
    for scores, alive in (source() for source in chunks.sources):
        out = torch.empty(scores.numel(), dtype=out_dtype)
        for start, piece, magnitudes, _ in chunks.magnitudes(scores, alive, out):
            n = piece.numel()
            equal = None
            if take:
                flags = chunks.flags[:n].copy_(torch.eq(magnitudes, bound, out=chunks.low[:n]))
                equal = positions(flags, take) + start
                take -= equal.numel()
            chosen = below(magnitudes, bound, out=chunks.low[:n])  # never where NaN
            write(piece, chosen, hit)
            if equal is not None:
                out[equal] = hit
        yield out
