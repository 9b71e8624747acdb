"""What the selection kernels take and give: sources of scores, counts, masks; their checks.

Shared by every path: counting the entries that compete, checking k, scores
and products, and turning selections into masks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from prunekit.core.backend import namespace
from prunekit.core.finite import all_finite as finite
from prunekit.select import tuning

__all__ = [
    "Count",
    "NotFinite",
    "Source",
    "alive_count",
    "all_finite",
    "all_or_none",
    "check_flags",
    "check_products",
    "competing",
    "competing_finite",
    "complement",
    "count_of",
    "multiplied",
    "refuse_non_finite",
    "refusing_meta",
]

Count = int | Callable[[int], int]
"""How many entries to choose: a number, or a function of how many compete."""

Source = Callable[[], tuple[Tensor, Tensor | None]]
"""Returns one tensor's scores and which of them compete: True or 1 there (None: all do).

The flags may be a bool tensor or a mask of any dtype (entries equal to 1 compete).

Called about once per pass, so a source may recompute its scores instead of holding them.
"""


class NotFinite(ValueError):
    """Raised, when asked, if a score is NaN or infinite."""


def refusing_meta(source: Source, where: str, owner: str) -> Source:
    """`source`, read as it is, but refusing scores or flags on the meta device: a shape
    without values, which the C loop would read as memory (a crash) and the tensor methods
    would rank into masks without values. Every entry of the selection wraps its sources,
    so every read is checked (an attribute's look-up, not a pass over the values).

    Args:
        source: the source the caller gave.
        where: the source as the caller named it (``'sources[2]'``, ``'pieces[0]'``).
        owner: the entry point the error names.

    Returns:
        The source that checks what it returns.
    """

    def read() -> tuple[Tensor, Tensor | None]:
        scores, alive = source()
        for what, value in (("scores", scores), ("flags", alive)):
            if isinstance(value, Tensor) and value.is_meta:
                raise ValueError(
                    f"{owner}: {where} gave {what} on the meta device (a shape without "
                    "values, which cannot be ranked); expected tensors holding values, on "
                    "the CPU or another device"
                )
        return scores, alive

    return read


def count_of(k: Count, total: int) -> int:
    """The number of entries to choose among `total`, checked."""
    count = k(total) if callable(k) else k
    if not 0 <= count <= total:
        raise ValueError(f"smallest_k: k={count} is outside [0, {total}], the entries that compete")
    return count


def alive_count(scores: Tensor, alive: Tensor | None) -> int:
    """How many entries of `scores` compete: those where `alive` is 1/True (all for None)."""
    if alive is None:
        return scores.numel()
    if alive.dtype == namespace(alive).bool:
        return int(alive.count_nonzero())
    if not isinstance(alive, Tensor):
        return int((alive == 1).count_nonzero())
    chunk = tuning.get().chunk
    flat = alive.reshape(-1)
    flags = torch.empty(min(chunk, flat.numel()), dtype=torch.bool)
    count = 0
    for start in range(0, flat.numel(), chunk):
        part = flat[start : start + chunk]
        count += int(torch.eq(part, 1, out=flags[: part.numel()]).count_nonzero())
    return count


def competing(sources: Sequence[Source]) -> int:
    """How many entries of all sources compete."""
    return sum(alive_count(*source()) for source in sources)


def all_finite(t: Tensor) -> bool:
    """True if `t` holds no NaN or infinity, read in chunks of the tuning's size."""
    return finite(t, tuning.get().chunk)


def competing_finite(scores: Tensor, alive: Tensor | None) -> bool:
    """True if the competing scores (where `alive` is True or 1; all for None) hold no NaN
    or infinity, read in chunks of the tuning's size. What lies behind the flags (entries
    pruned before) never counts, whatever it holds: the selection's one rule for it."""
    if alive is None:
        return all_finite(scores)
    flat, flags = scores.reshape(-1), alive.reshape(-1)
    ns = namespace(flat)
    chunk = tuning.get().chunk
    for start in range(0, flat.numel(), chunk):
        part = flat[start : start + chunk]
        if math.isfinite(float(part.sum())):  # every entry finite, competing or not
            continue
        live = flags[start : start + chunk]
        live = live if live.dtype == ns.bool else live == 1
        if bool((~ns.isfinite(part) & live).any()):
            return False
    return True


def refuse_non_finite(sources: Sequence[Source]) -> None:
    """Raise NotFinite if a competing score is NaN or infinite (what lies behind the
    flags does not count)."""
    if not all(competing_finite(*source()) for source in sources):
        raise NotFinite("the scores hold NaN or infinity, which cannot be ranked")


def check_flags(index: int, scores: Tensor, alive: Tensor | None) -> None:
    """Raise ValueError unless a source's flags (if any) are as many as its scores."""
    if alive is not None and alive.numel() != scores.numel():
        raise ValueError(
            f"smallest_k_many: source {index} has {scores.numel()} scores and "
            f"{alive.numel()} flags; expected one flag per score"
        )


def check_products(
    sources: Sequence[Source], products: Sequence[Tensor | None], keep_dtype: torch.dtype | None
) -> None:
    """Raise ValueError unless each product is a contiguous tensor of `keep_dtype` with
    as many entries as its source's scores, on their device, not sharing their memory."""
    if keep_dtype is None:
        raise ValueError("smallest_k_many: products need keep_dtype, the masks' dtype")
    for index, (source, product) in enumerate(zip(sources, products, strict=True)):
        if product is None:
            continue
        scores = source()[0]
        n = scores.numel()
        if not (
            product.numel() == n
            and product.dtype == keep_dtype
            and product.is_contiguous()
            and product.device == scores.device
            and not (n and _same_memory(product, scores))
        ):
            raise ValueError(
                f"smallest_k_many: products[{index}] is {product.numel()} "
                f"{'contiguous' if product.is_contiguous() else 'strided'} {product.dtype} "
                f"entries on {product.device}; expected {n} contiguous {keep_dtype} entries "
                f"on {scores.device}, as its scores, and in memory of its own"
            )


def _same_memory(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors live in the same storage."""
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def multiplied(
    masks: Iterator[Tensor], sources: Sequence[Source], products: Sequence[Tensor | None]
) -> Iterator[Tensor]:
    """The masks as they are, each product written as its mask is yielded."""
    for mask, source, product in zip(masks, sources, products, strict=True):
        if product is not None:
            torch.mul(source()[0].detach().reshape(-1), mask, out=product)
        yield mask


def complement(chosen: Iterator[Tensor], keep_dtype: torch.dtype | None) -> Iterator[Tensor]:
    """The selections as they are, or with `keep_dtype` as masks (1 = not chosen)."""
    if keep_dtype is None:
        return chosen
    return ((~pick).to(keep_dtype) for pick in chosen)


def all_or_none(
    sources: Sequence[Source], everything: bool, keep_dtype: torch.dtype | None
) -> Iterator[Tensor]:
    """Every competing entry of each source chosen (`everything`), or none."""
    chosen = (_filled(*source(), everything=everything) for source in sources)
    return complement(chosen, keep_dtype)


def _filled(scores: Tensor, alive: Tensor | None, everything: bool) -> Tensor:
    flat = scores.reshape(-1)
    ns = namespace(scores)
    if alive is not None:
        live = alive.reshape(-1)
        live = live.clone() if live.dtype == ns.bool else live == 1
        return live if everything else live & False
    fill = ns.ones if everything else ns.zeros
    filled: Tensor = fill(flat.shape, dtype=ns.bool, device=flat.device)
    return filled
