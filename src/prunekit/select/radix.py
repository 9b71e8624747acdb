"""The k-th smallest magnitude from histograms of bits, over a group of processes.

A float's bits, read as 16-bit digits from the top, order non-negative floats
the same way as their values, so a ``bincount`` of the top digit finds the
bucket that holds the k-th value, and the next digits are counted only inside
that bucket. The engine refines with it where the bits can be read: over the
entries its count pass gathered, or, where the bounds missed, over the scores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from prunekit.select.process_group import Group
from prunekit.select.strategy import KEYS

__all__ = ["descend", "find", "pick", "top_digits"]

_TOP_BINS = 1 << 15  # the top digit without its sign bit
_LOW_BINS = 1 << 16
_DEAD = 0x7FFF  # top digit, sign cleared, of entries that do not compete: NaN in every format


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


def pick(hist: Tensor, rank: int) -> tuple[int, int, int]:
    """The bin holding the `rank`-th entry (1-based), that entry's rank within the bin,
    and the bin's count."""
    cum = hist.cumsum(0)
    index = int((cum < rank).count_nonzero())
    below = int(cum[index - 1]) if index else 0
    return index, rank - below, int(hist[index])
