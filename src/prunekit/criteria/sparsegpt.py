"""SparseGPT's math: prune a Linear weight and update the weights left so that its output on
the calibration inputs changes least (optimal brain surgery with the layer Hessian X^T X).

Columns (input features) are pruned in order. When column j loses entries, the error is
spread over the columns after it with row j of the upper Cholesky factor of H^-1, which
is [H_F^-1]_{j,:} / sqrt([H_F^-1]_jj) for F = {j, j+1, ...}: the exact OBS update given
that the columns before j are fixed. Work is done in blocks of `blocksize` columns (the
update of the columns after a block is one matrix product); the pattern chooses what each
block prunes from the saliency w^2 / [H_F^-1]_jj of its current weights: Unstructured and
PerRow at the start of a block. NM chooses at the start of each group, from its current
weights too, the way to prune whose sweep over the group adds the least loss (each
column's saliency alone leaves out how pruning one moves the next). Counts are spread
over the blocks by cumulative rounding, so the totals are the pattern's exact ones.

Weights that read the same input (query, key and value; gate and up) have one Hessian:
`sparsegpt_prune_shared` factors it once and sweeps their rows stacked, each weight with
its own counts. Inside a block, columns go 16 at a time (one outer product per column on
those 16 only, then one matrix product for the rest of the block), in the Hessian's dtype
(float32 from calibration): no lower precision, as bf16 and float16 products run 6x and
20x slower than float32 on a CPU without bf16 arithmetic (AVX2, X^T X of 2048 x 1536).
Memory: the Hessian and its factor (in x in each), the stacked weights and their masks,
and one block's errors.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from prunekit.core.amount import Amount, validate_pruning_amount_init
from prunekit.core.checks import check_finite, check_number
from prunekit.core.errors import naming, value_error
from prunekit.core.heap import trim
from prunekit.criteria.hessian import damped, inverse_factor
from prunekit.patterns import NM, Pattern, PerRow, Unstructured
from prunekit.select import smallest_k
from prunekit.select.rows import smallest_per_row
from prunekit.select.tuning import torch_threads

__all__ = ["SparseGPT", "refit", "sparsegpt_prune", "sparsegpt_prune_shared"]

Chooser = Callable[[Tensor, Tensor | None, int], Tensor]
"""(saliency of a block, its alive flags or None for all, the block's first column) ->
pruned flags."""

_STEP = 16
"""Columns swept one by one between two matrix products (see _sweep_block)."""

_ROWS = 256
"""Rows of the refit's dot products done at a time (their products' buffer)."""

_SUBSETS = 70
"""NM groups with at most this many ways to prune (4:8 has 70) are pruned the way of
least loss (`_least_loss`); larger ones by each column's saliency."""


@dataclass(frozen=True)
class SparseGPT:
    """SparseGPT's settings: `damp` adds ``damp * mean(diag(H))`` to the Hessian's diagonal
    (it must be positive definite); `blocksize` columns are pruned and updated at a time
    (a multiple of m for an NM pattern); `refit` steps then move the kept weights toward
    the least error their mask allows.

    Args:
        damp: the share of the Hessian's mean diagonal added to its diagonal, a finite
            float >= 0 (0.1 by default: on 16 x 128 calibration tokens a smaller one fits
            the calibration text's noise and costs other texts); raise it when the Hessian
            is reported singular.
        blocksize: how many columns are pruned and compensated at a time, an int >= 1 (128 by
            default); larger blocks choose the mask over more columns at once.
        refit: steps of conjugate gradients after the sweep, an int >= 0 (7 by default),
            which move the weights kept toward the least error ``(W - W0) H (W - W0)^T``
            (H damped) that their mask allows; 0: the sweep's weights as they are. Each
            step costs one product by H; 7 steps leave about 0.6 % more of the starting
            error than 10 do (the mean over SmolLM2-135M's layers) for 3/11 less time.

    Raises:
        TypeError: `damp`, `blocksize` or `refit` is not a number (`blocksize` and `refit`
            not ints).
        ValueError: `damp` is negative or not finite, `blocksize` is below 1, or `refit`
            below 0.
    """

    damp: float = 0.1
    blocksize: int = 128
    refit: int = 7

    def __post_init__(self) -> None:
        check_number(self.damp, "damp", "SparseGPT", "a finite float >= 0",
                     lambda v: 0 <= v < math.inf)  # fmt: skip
        check_number(self.blocksize, "blocksize", "SparseGPT", "an int >= 1", lambda v: v >= 1,
                     integral=True)  # fmt: skip
        check_number(self.refit, "refit", "SparseGPT", "an int >= 0", lambda v: v >= 0,
                     integral=True)  # fmt: skip
        object.__setattr__(self, "damp", float(self.damp))
        object.__setattr__(self, "blocksize", int(self.blocksize))
        object.__setattr__(self, "refit", int(self.refit))


def sparsegpt_prune(
    weight: Tensor,
    hessian: Tensor,
    amount: Amount | float,
    pattern: Pattern,
    alive: Tensor | None = None,
    settings: SparseGPT = SparseGPT(),
) -> tuple[Tensor, Tensor]:
    """Prune `weight` (out x in) with `hessian` (in x in, e.g. the sum or mean of X^T X).

    Returns (keep, updated): bool flags of the entries kept, and the weights with the
    pruned ones at 0 and the others updated, in `weight`'s dtype. `alive` (bool) marks
    the entries still unpruned: the others stay at 0 and do not count. The work is done
    in the Hessian's dtype (float32 or float64).

    Args:
        weight: the weight matrix, out x in.
        hessian: in x in, e.g. the sum or mean of X^T X over the layer's inputs.
        amount: a float in [0, 1] (a fraction) or an int >= 0 (a count), as ``prune_model``
            takes it (numpy numbers too), or an ``Amount`` naming the errors' owner.
        pattern: ``Unstructured``, ``PerRow`` or ``NM``.
        alive: bool flags of the entries still unpruned, or None (all of them).
        settings: the damping, block size and refit steps.

    Returns:
        (keep, updated), as above.

    Raises:
        TypeError: an `amount` that is no number (a bool included).
        ValueError: an `amount` out of range, or a weight, Hessian or pattern that do not
            fit (naming what is wrong).
    """
    checked = _amount(amount, "sparsegpt_prune")
    return sparsegpt_prune_shared([weight], hessian, checked, pattern, [alive], settings)[0]


def _amount(amount: Amount | float, owner: str) -> Amount:
    """`amount` as an Amount: one given as is, or a number checked as ``prune_model`` checks
    it, its errors going by `owner`."""
    if isinstance(amount, Amount):
        return amount
    validate_pruning_amount_init(amount, owner)
    value = int(amount) if isinstance(amount, numbers.Integral) else float(amount)
    return Amount(value, owner)


def sparsegpt_prune_shared(
    weights: Sequence[Tensor],
    hessian: Tensor,
    amount: Amount,
    pattern: Pattern,
    alives: Sequence[Tensor | None] | None = None,
    settings: SparseGPT = SparseGPT(),
    names: Sequence[str] | None = None,
    spend_hessian: bool = False,
) -> list[tuple[Tensor, Tensor]]:
    """`sparsegpt_prune` of several weights that read the same input (query, key and
    value; gate and up), so share `hessian`: it is factored once, and one sweep over the
    columns updates the rows of all of them stacked. Each weight gets the masks and
    updates it would get alone (its own counts; the same up to rounding).

    Returns (keep, updated) per weight, in order. `names` (one per weight) go in front of
    the errors about one weight (its shape, its amount), and all of them in front of the
    errors about the Hessian. With `spend_hessian`, `hessian` is damped in place and the
    refit reads it (one in x in matrix fewer; the same results): its values are the
    damped ones after the call, so pass it only when nothing reads it again.
    """
    labels = list(names) if names is not None else [""] * len(weights)
    found = alives if alives is not None else [None] * len(weights)
    lives = []
    for weight, alive, label in zip(weights, found, labels, strict=True):
        with _named(label):
            _check_hessian_shape(weight, hessian, amount.owner)
            _check_finite(weight, alive, amount.owner)
        lives.append(torch.ones(weight.shape, dtype=torch.bool) if alive is None else alive)
    choose = _stacked_chooser(pattern, amount, lives, settings.blocksize, labels)  # checks first
    live = torch.cat(lives)
    w = torch.cat([weight.detach().to(dtype=hessian.dtype) for weight in weights])
    if any(alive is not None for alive in found):
        w.masked_fill_(~live, 0)
    with _named(" and ".join(label for label in labels if label)):
        upper, dead = inverse_factor(hessian, settings.damp, amount.owner, spend_hessian)
    trim()  # the factorization's two freed in x in matrices, not kept beside the sweep's
    pruned = torch.zeros(w.shape, dtype=torch.bool)
    sweep = _Sweep(w, upper, live, dead, pruned, choose, pattern, _subsets(pattern))
    cols = hessian.shape[1]
    for start in range(0, cols, settings.blocksize):
        stop = min(cols, start + settings.blocksize)
        _sweep_block(sweep, start, stop)
    keep = live & ~pruned  # the others are 0 in `w` (each block zeroes those it drops)
    del sweep, upper, pruned, lives  # the refit reads none of them
    if settings.refit:
        gap = _gap(weights, w, live)
        del live
        trim()  # the sweep's freed pages, not kept resident beside the refit's buffers
        h = hessian if spend_hessian else damped(hessian, settings.damp)  # damped in place
        _refit(w, gap, keep, h, settings.refit)
    sizes = [weight.shape[0] for weight in weights]
    return [
        (k, u.to(dtype=weight.dtype))
        for k, u, weight in zip(
            torch.split(keep, sizes), torch.split(w, sizes), weights, strict=True
        )
    ]


def _gap(weights: Sequence[Tensor], w: Tensor, live: Tensor) -> Tensor:
    """The weights before pruning (stacked, 0 where not `live`) minus `w`, made in one
    buffer of `w`'s shape and dtype, without a stacked copy of the weights. Where not
    `live`, `w` is 0 (each block of the sweep zeroes what it drops), so 0 as the
    difference of the stacked copy would be."""
    gap = torch.empty_like(w)
    first = 0
    for weight in weights:
        last = first + weight.shape[0]
        torch.sub(weight.detach().to(dtype=w.dtype), w[first:last], out=gap[first:last])
        first = last
    if not bool(live.all()):
        gap.masked_fill_(~live, 0)
    return gap


def refit(w: Tensor, dense: Tensor, keep: Tensor, hessian: Tensor, steps: int) -> None:
    """Move the entries of `w` (rows, columns) that `keep` marks toward the least error
    ``(w - dense) H (w - dense)^T`` of each row with the others fixed at their values in `w`,
    by `steps` of conjugate gradients preconditioned with H's diagonal, every row at once
    (its own step sizes). `hessian` H (columns x columns) must be positive definite (damped).
    Each step costs one product (rows x columns) by H; with as many steps as a row keeps
    entries the least error is reached, up to rounding. In place; the other entries of `w`
    do not change.

    Args:
        w: the pruned weights, updated in place (the dtype of `hessian`).
        dense: the weights before pruning (the target).
        keep: bool flags of the entries that may move, the shape of `w`.
        hessian: the damped Hessian.
        steps: the number of conjugate gradient steps.
    """
    _refit(w, dense - w, keep, hessian, steps)


def _refit(w: Tensor, gap: Tensor, keep: Tensor, hessian: Tensor, steps: int) -> None:
    """`refit` from ``gap = dense - w``, a buffer of w's shape it takes over (written)."""
    # The entries held fixed are masked once, in the preconditioner (1 / H_jj where free,
    # 0 where fixed): the directions are 0 there, so w does not move there, and the residual
    # there is never read. Four buffers of w's shape serve every step (`gap` becomes the
    # first direction), and a few rows of work for the dot products.
    scaled = keep.to(dtype=w.dtype).mul_(hessian.diagonal().reciprocal())
    residual = torch.mm(gap, hessian)  # minus the gradient, halved, where free
    direction = torch.mul(residual, scaled, out=gap)
    moved = torch.empty_like(direction)
    work = torch.empty((min(_ROWS, w.shape[0]), w.shape[1]), dtype=w.dtype)
    along = _rows_dot(residual, direction, work)
    for _ in range(steps):
        torch.mm(direction, hessian, out=moved)
        curve = _rows_dot(direction, moved, work)
        size = torch.where(curve > 0, along / curve, torch.zeros_like(curve))
        w.addcmul_(size, direction)
        residual.addcmul_(size, moved, value=-1)
        preconditioned = torch.mul(residual, scaled, out=moved)
        after = _rows_dot(residual, preconditioned, work)
        ratio = torch.where(along > 0, after / along, torch.zeros_like(along))
        preconditioned.add_(direction.mul_(ratio))
        direction, moved = preconditioned, direction
        along = after


def _rows_dot(a: Tensor, b: Tensor, work: Tensor) -> Tensor:
    """Each row's dot product of `a` and `b`, (rows, 1), `work.shape[0]` rows at a time
    (`work`, as wide as they are, is written): each row's sum is the one over all rows
    at once, as each row is summed alone either way."""
    found = torch.empty((a.shape[0], 1), dtype=a.dtype)
    step = work.shape[0]
    for top in range(0, a.shape[0], step):
        bottom = min(a.shape[0], top + step)
        products = torch.mul(a[top:bottom], b[top:bottom], out=work[: bottom - top])
        torch.sum(products, dim=1, keepdim=True, out=found[top:bottom])
    return found


def _named(label: str) -> AbstractContextManager[None]:
    """`naming(label)`, or nothing for no label."""
    return naming(label) if label else nullcontext()


def _check_hessian_shape(weight: Tensor, hessian: Tensor, owner: str) -> None:
    cols = weight.shape[1]
    if tuple(hessian.shape) != (cols, cols):
        raise value_error(
            f"{owner}: the Hessian has shape {tuple(hessian.shape)}; expected "
            f"({cols}, {cols}) for a weight of shape {tuple(weight.shape)}"
        )


def _check_finite(weight: Tensor, alive: Tensor | None, owner: str) -> None:
    """Refuse a NaN or infinite entry still alive: it cannot be ranked, and the sweep would
    carry its error into every later column of its row."""
    competing = weight.detach() if alive is None else weight.detach().masked_fill(~alive, 0)
    check_finite(competing, owner, "weights")


@dataclass(frozen=True)
class _Sweep:
    """What every block of one sweep reads: the weights `w` (rows stacked, float32, pruned
    in place), the upper factor of the inverse Hessian, which entries are `live` and which
    inputs are `dead`, the entries `pruned` so far (written), and how a block chooses."""

    w: Tensor
    upper: Tensor
    live: Tensor
    dead: Tensor
    pruned: Tensor
    choose: Chooser
    pattern: Pattern
    subsets: tuple[Tensor, Tensor] | None


def _sweep_block(sweep: _Sweep, start: int, stop: int) -> None:
    """Prune columns [start, stop) of `sweep.w` in place, spreading each column's error over
    the columns after it; marks `sweep.pruned`.

    The block's columns are held as rows (contiguous), and swept `_STEP` at a time: inside
    a step each column's error updates only the step's later columns (one outer product),
    and each step's errors update the block's later columns in one matrix product, as
    the block's errors update the columns after the block.
    """
    w, upper, choose, pattern = sweep.w, sweep.upper, sweep.choose, sweep.pattern
    factor = upper[start:stop, start:stop]
    diagonal = factor.diagonal()
    scale = (diagonal**2).unsqueeze(1)
    current = w[:, start:stop].T.contiguous()  # (columns, rows)
    errors = torch.empty_like(current)
    share = torch.empty_like(current)  # 1 / U_jj where an entry is dropped, else 0
    alive = sweep.live[:, start:stop]
    competing = None if bool(alive.all()) else alive
    chosen = sweep.pruned[:, start:stop]
    quiet = sweep.dead[start:stop]
    width = stop - start
    group = pattern.m if isinstance(pattern, NM) else width
    step = group * max(1, _STEP // group) if isinstance(pattern, NM) else _STEP
    subsets = sweep.subsets
    ways = None if subsets is None else _ways(factor, subsets[0], group)
    deadless = not bool(quiet.any())
    # one thread: the sweep's many small operations lose far more to waking threads than
    # they gain (about 6x on a busy 2-core machine)
    with torch_threads(1):
        for a in range(0, width, step):
            b = min(width, a + step)
            for i in range(a, b):
                if i % group == 0:
                    end = min(i + group, width)
                    part = None if competing is None else competing[:, i:end]
                    if ways is not None and subsets and part is None and end - i == group:
                        values = current[i:end]
                        if not deadless:
                            values = values.masked_fill(quiet[i:end, None], 0)
                        g = i // group
                        chosen[:, i:end] = _least_loss(values, ways[0][g], ways[1][g], subsets)
                    else:
                        saliency = (current[i:end] ** 2 / scale[i:end]).T.masked_fill(
                            quiet[i:end], 0
                        )
                        chosen[:, i:end] = choose(saliency, part, start + i)
                    _shares(chosen[:, i:end], part, diagonal[i:end], share[i:end])
                torch.mul(current[i], share[i], out=errors[i])
                if i + 1 < b:
                    current[i + 1 : b].addr_(factor[i, i + 1 : b], errors[i], alpha=-1)
            if b < width:
                current[b:].addmm_(factor[a:b, b:].T, errors[a:b], alpha=-1)
    current.masked_fill_(share != 0, 0)
    w[:, start:stop] = current.T
    w[:, stop:].addmm_(errors.T, upper[start:stop, stop:], alpha=-1)


def _subsets(pattern: Pattern) -> tuple[Tensor, Tensor] | None:
    """For an NM pattern whose groups have at most `_SUBSETS` ways to prune: every way, as
    (ways, m - n) column indices in increasing order and (ways, m) pruned flags."""
    if not isinstance(pattern, NM) or math.comb(pattern.m, pattern.n) > _SUBSETS:
        return None
    ways = list(itertools.combinations(range(pattern.m), pattern.m - pattern.n))
    index = torch.tensor(ways, dtype=torch.int64)
    flags = torch.zeros((len(ways), pattern.m), dtype=torch.bool)
    flags.scatter_(1, index, True)
    return index, flags


def _ways(factor: Tensor, index: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """What `_least_loss` reads of `factor` (a block's diagonal block of the upper factor
    U) for each whole group of `m` columns, gathered for the block at once: U_aa of each
    way's p-th pruned column a, (groups, k, ways, 1), and U_ab of its q-th and p-th ones,
    (groups, k, k, ways, 1); `index` (ways, k) holds each way's pruned columns."""
    first = torch.arange(0, factor.shape[0] - m + 1, m)
    at = first[:, None, None] + index.T  # (groups, k, ways)
    diagonal = factor[at, at].unsqueeze(-1)
    between = factor[at[:, :, None, :], at[:, None, :, :]].unsqueeze(-1)
    return diagonal, between


def _least_loss(
    values: Tensor, diagonal: Tensor, between: Tensor, subsets: tuple[Tensor, Tensor]
) -> Tensor:
    """Which entries of one NM group to prune, per row: the way whose sweep over the
    group's columns adds the least loss. `values` (m, rows) are the group's current
    weights; `diagonal` and `between` the group's entries of the upper factor U each way
    reads (see `_ways`).

    Pruning columns a < b < ... of the group, the sweep removes e_a = w_a / U_aa at a,
    which moves w_b by -e_a U_ab, then e_b = (w_b - e_a U_ab) / U_bb at b, and so on; the
    loss it adds is sum e^2 (the entries kept move no other). The saliency w^2 / U_jj^2
    of each column alone leaves out those moves: with correlated inputs its choice can
    cost more.

    Returns (rows, m) bool: True where pruned.
    """
    index, flags = subsets
    picked = values[index.T]  # (k, ways, rows): each way's p-th pruned column
    errors: list[Tensor] = []
    loss = None
    for p in range(index.shape[1]):
        moved = picked[p]
        for q in range(p):
            moved = moved - errors[q] * between[q, p]
        error = moved / diagonal[p]
        loss = error.square() if loss is None else loss + error.square()
        errors.append(error)
    assert loss is not None
    # min's indices are argmin's (the first of equal losses; a NaN's), 10x faster over
    # the leading dim (torch 2.13, CPU).
    chosen: Tensor = flags[loss.min(dim=0).indices]
    return chosen


def _shares(chosen: Tensor, alive: Tensor | None, diagonal: Tensor, out: Tensor) -> None:
    """Into `out` (columns, rows): 1 / U_jj for the entries dropped at column j (chosen
    now, or no longer alive), else 0."""
    dropped = chosen if alive is None else chosen | ~alive
    torch.div(dropped.T, diagonal.unsqueeze(1), out=out)


def _stacked_chooser(
    pattern: Pattern,
    amount: Amount,
    lives: Sequence[Tensor],
    blocksize: int,
    names: Sequence[str],
) -> Chooser:
    """The chooser of weights stacked by rows: each weight's own (`_chooser`) on its rows;
    one for all rows with NM, whose choice is made row by row anyway."""
    parts: list[tuple[int, int, Chooser]] = []
    first = 0
    for index, live in enumerate(lives):
        with _named(names[index]):
            chooser = _chooser(pattern, amount, live, blocksize)
        parts.append((first, first + live.shape[0], chooser))
        first += live.shape[0]
    if len(parts) == 1 or isinstance(pattern, NM):
        return parts[0][2]

    def stacked(saliency: Tensor, alive: Tensor | None, column: int) -> Tensor:
        chosen = torch.empty(saliency.shape, dtype=torch.bool)
        for top, bottom, chooser in parts:
            part = None if alive is None else alive[top:bottom]
            chosen[top:bottom] = chooser(saliency[top:bottom], part, column)
        return chosen

    return stacked


def _chooser(pattern: Pattern, amount: Amount, live: Tensor, blocksize: int) -> Chooser:
    """What each block (or NM group) prunes, for the patterns SparseGPT can follow."""
    if isinstance(pattern, NM):
        pattern.check(tuple(live.shape), amount)
        if pattern.dim not in (1, -1):
            raise value_error(
                f"{amount.owner}: SparseGPT groups NM entries along the input dim (dim=1); "
                f"got {pattern!r}"
            )
        if blocksize % pattern.m:
            raise value_error(
                f"{amount.owner}: blocksize={blocksize} is not a multiple of m={pattern.m}; "
                f"expected a blocksize divisible by {pattern.m}"
            )
        return lambda saliency, alive, _: pattern.pruned_groups(saliency, alive)
    if isinstance(pattern, PerRow) and pattern.dim in (0, -2):
        left = live.sum(dim=1)
        if isinstance(amount.value, numbers.Integral):
            amount.count(int(left.min()))
            totals = torch.full_like(left, int(amount.value))
        else:
            totals = torch.round(left.to(torch.float64) * float(amount.value)).to(torch.int64)
        before = live.cumsum(dim=1)
        return lambda saliency, alive, first: smallest_per_row(
            saliency, _share(totals, left, before, first, saliency.shape[1]), alive
        )
    if type(pattern) is Unstructured:
        everything = int(live.sum())
        total = amount.count(everything)
        counted = [0, *live.sum(dim=0).cumsum(dim=0).tolist()]

        def block(saliency: Tensor, alive: Tensor | None, first: int) -> Tensor:
            seen, upto = counted[first], counted[first + saliency.shape[1]]
            k = _rounded(total, upto, everything) - _rounded(total, seen, everything)
            return smallest_k(saliency, int(k), alive)

        return block
    raise value_error(
        f"{amount.owner}: SparseGPT prunes with the patterns Unstructured(), PerRow(dim=0) "
        f"and NM(n, m); got {pattern!r}"
    )


def _share(totals: Tensor, left: Tensor, before: Tensor, first: int, width: int) -> Tensor:
    """Each row's count for columns [first, first + width): its total spread by cumulative
    rounding over the columns still alive."""
    seen = before[:, first - 1] if first else torch.zeros_like(left)
    upto = before[:, first + width - 1]
    share: Tensor = _rounded(totals, upto, left) - _rounded(totals, seen, left)
    return share


def _rounded(total: Any, part: Any, whole: Any) -> Any:
    """round(total * part / whole), halves up, in integers: Python ints or int64 tensors
    alike (where `whole` is 0, so is `part`, and the result)."""
    if isinstance(whole, int):
        return (2 * total * part + whole) // (2 * whole) if whole else 0
    return (2 * total * part + whole) // (2 * whole).clamp(min=1)
