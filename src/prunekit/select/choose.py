"""smallest_k and smallest_k_many: check what is asked, run the one driver (engine.run) over
the engine's steps or the portable ones, hand the selections out."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from prunekit.select import engine, strategy, trace
from prunekit.select.engine import Chosen
from prunekit.select.inputs import (
    Count,
    Source,
    all_or_none,
    check_products,
    competing,
    count_of,
    multiplied,
    refuse_non_finite,
    refusing_meta,
)
from prunekit.select.passes import Marks
from prunekit.select.pieces import Piece, select
from prunekit.select.portable import Portable
from prunekit.select.process_group import Alone

__all__ = ["smallest_k", "smallest_k_many"]


def smallest_k(
    scores: Tensor, k: int, alive: Tensor | None = None, *, magnitude: bool = False
) -> Tensor:
    """Return a bool tensor shaped like `scores`, True at its `k` smallest entries.

    Only entries where `alive` is True or 1 compete (all of them when it is None).
    With `magnitude`, entries rank by absolute value. Ties go to the lower
    flat index. `scores` must hold no NaN among the competing entries.
    """
    flat = scores.reshape(-1)
    live = None if alive is None else alive.reshape(-1)
    chosen = next(
        smallest_k_many([lambda: (flat, live)], k, magnitude=magnitude, owner="smallest_k")
    )
    return chosen.reshape(scores.shape)


def smallest_k_many(
    sources: Sequence[Source],
    k: Count,
    *,
    magnitude: bool = False,
    keep_dtype: torch.dtype | None = None,
    total: int | None = None,
    finite: bool = False,
    products: Sequence[Tensor | None] | None = None,
    owner: str = "smallest_k_many",
) -> Iterator[Tensor]:
    """Yield, for each source in turn, a flat bool tensor marking its share of the `k` smallest.

    The scores of all sources rank together as if concatenated in order, but
    are never concatenated: each source is called once per pass and dropped.
    When the sampled guess holds, all selections are made in one pass and held
    until yielded; otherwise each is made when asked for. With `keep_dtype`, each yields
    the complement instead, as 1s (kept, or not competing) and 0s (chosen) of
    that dtype: a mask, made without an intermediate bool tensor. `total`, if
    the caller knows it, is how many entries compete in all. `k` may be a
    function of that count: the one pass then counts the competing entries
    itself instead of reading them beforehand. The function may be called with
    estimates of the count too, and raise ValueError to refuse one: a refused
    estimate costs speed only, a refused count is raised. With `finite`, raises
    NotFinite if a competing score is NaN or infinite, after any error about `k` and
    before yielding anything. What lies behind the flags (entries that do not compete)
    never counts, whatever it holds: it is neither ranked nor refused.

    `products` (with `keep_dtype`) may hold, per source, a flat tensor of that dtype
    into which the source's scores times its mask are written by the time the mask
    is yielded: in the one pass, as the mask is written, while the scores are read
    anyway. A source given a product must have no flags and finite scores.

    A source giving scores or flags on the meta device (no values) raises ValueError
    naming `owner` (the entry point the caller is) and the source.
    """
    sources = [refusing_meta(s, f"sources[{i}]", owner) for i, s in enumerate(sources)]
    if products is not None:
        check_products(sources, products, keep_dtype)
    chosen = strategy.make(sources, magnitude)
    if not chosen.fast and total is None:
        total = competing(sources)
    count = None if total is None else count_of(k, total)  # a bad k is named before bad scores
    if count is None or count not in (0, total):  # a selection to make
        marks = Marks(keep_dtype, products, finite, smallest_k)
        made = _select(sources, chosen, k if count is None else count, total, magnitude, marks)
        assert made.k is not None and made.total is not None
        count, total = made.k, made.total
        if made.held is not None:
            return iter(made.held)
        if count not in (0, total):
            masks = made.masks(keep_dtype)
            return masks if products is None else multiplied(masks, sources, products)
    elif finite:
        refuse_non_finite(sources)
    assert total is not None and count is not None
    trace.note("all or none")
    masks = all_or_none(sources, count > 0, keep_dtype)
    return masks if products is None else multiplied(masks, sources, products)


def _select(
    sources: Sequence[Source],
    route: strategy.Route,
    k: Count,
    total: int | None,
    magnitude: bool,
    marks: Marks,
) -> Chosen:
    """The one driver (engine.run) over the engine's steps where the route is fast (CPU
    torch floats, magnitudes), else over the portable ones (their scores checked first
    as `marks` asks)."""
    if route.fast:
        return select(_whole(sources, route), k, Alone(), total, marks, route.signed)
    assert total is not None  # counted first
    if marks.finite:
        refuse_non_finite(sources)
    return engine.run(Portable(sources, route, magnitude, total), k)


def _whole(sources: Sequence[Source], route: strategy.Route) -> list[Piece]:
    """Whole tensors as the engine's pieces: one run each, keyed by their order."""
    return [
        Piece(source, numel, dtype, index)
        for index, (source, (numel, dtype)) in enumerate(zip(sources, route.each, strict=True))
    ]
