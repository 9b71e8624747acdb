"""SparseGPT's math: prune a Linear weight and update the weights left so that its output on
the calibration inputs changes least (optimal brain surgery with the layer Hessian X^T X).

Columns (input features) are pruned in order. When column j loses entries, the error is
spread over the columns after it with row j of the upper Cholesky factor of H^-1, which
is [H_F^-1]_{j,:} / sqrt([H_F^-1]_jj) for F = {j, j+1, ...}: the exact OBS update given
that the columns before j are fixed. Work is done in blocks of `blocksize` columns (the
update of the columns after a block is one matrix product); the pattern chooses what each
block prunes from the saliency w^2 / [H_F^-1]_jj of its current weights: Unstructured and
PerRow at the start of a block, NM at the start of each group. Counts are spread over the
blocks by cumulative rounding, so the totals are the pattern's exact ones.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from prunekit.core.amount import Amount
from prunekit.core.errors import type_error, value_error
from prunekit.patterns import NM, Pattern, PerRow, Unstructured
from prunekit.patterns.rowwise import smallest_per_row
from prunekit.select import smallest_k

__all__ = ["SparseGPT", "sparsegpt_prune"]

Chooser = Callable[[Tensor, Tensor, int], Tensor]
"""(saliency of a block, its alive flags, the block's first column) -> pruned flags."""


@dataclass(frozen=True)
class SparseGPT:
    """SparseGPT's settings: `damp` adds ``damp * mean(diag(H))`` to the Hessian's diagonal
    (it must be positive definite); `blocksize` columns are pruned and updated at a time
    (a multiple of m for an NM pattern)."""

    damp: float = 0.01
    blocksize: int = 128

    def __post_init__(self) -> None:
        if isinstance(self.damp, bool) or not isinstance(self.damp, int | float):
            raise type_error(f"SparseGPT: invalid damp={self.damp!r}; expected a number >= 0")
        if not self.damp >= 0:
            raise value_error(f"SparseGPT: invalid damp={self.damp!r}; expected a number >= 0")
        if isinstance(self.blocksize, bool) or not isinstance(self.blocksize, int):
            raise type_error(f"SparseGPT: invalid blocksize={self.blocksize!r}; expected an int")
        if self.blocksize < 1:
            raise value_error(
                f"SparseGPT: invalid blocksize={self.blocksize}; expected an int >= 1"
            )


def sparsegpt_prune(
    weight: Tensor,
    hessian: Tensor,
    amount: Amount,
    pattern: Pattern,
    alive: Tensor | None = None,
    settings: SparseGPT = SparseGPT(),
) -> tuple[Tensor, Tensor]:
    """Prune `weight` (out x in) with `hessian` (in x in, e.g. the sum or mean of X^T X).

    Returns (keep, updated): bool flags of the entries kept, and the weights with the
    pruned ones at 0 and the others updated, in `weight`'s dtype. `alive` (bool) marks
    the entries still unpruned: the others stay at 0 and do not count. The work is done
    in the Hessian's dtype (float32 or float64).
    """
    cols = weight.shape[1]
    if tuple(hessian.shape) != (cols, cols):
        raise value_error(
            f"{amount.owner}: the Hessian has shape {tuple(hessian.shape)}; expected "
            f"({cols}, {cols}) for a weight of shape {tuple(weight.shape)}"
        )
    dtype = hessian.dtype
    live = torch.ones(weight.shape, dtype=torch.bool) if alive is None else alive.clone()
    w = weight.detach().to(dtype=dtype).clone().masked_fill_(~live, 0)
    choose = _chooser(pattern, amount, live, settings.blocksize)  # checks come first
    upper, dead = _inverse_factor(hessian, settings.damp, amount.owner)
    pruned = torch.zeros(weight.shape, dtype=torch.bool)
    for start in range(0, cols, settings.blocksize):
        stop = min(cols, start + settings.blocksize)
        _sweep_block(w, upper, live, dead, pruned, start, stop, choose, pattern)
    keep = live & ~pruned
    return keep, w.masked_fill_(~keep, 0).to(dtype=weight.dtype)


def _inverse_factor(hessian: Tensor, damp: float, owner: str) -> tuple[Tensor, Tensor]:
    """The upper Cholesky factor of (H + damp * mean(diag H) * I)^-1, and which inputs
    never fired (a zero diagonal: their weights cost nothing to prune)."""
    h = hessian.detach().clone()
    if not bool(torch.isfinite(h).all()):
        kind = "inf" if bool(torch.isinf(h).any()) else "NaN"
        raise value_error(
            f"{owner}: the layer's Hessian (mean of X^T X over its inputs) holds {kind} "
            f"entries: the squares of its inputs overflow {h.dtype} (or the inputs were not "
            "finite), which no damp can fix; expected calibration inputs whose squares fit "
            f"{h.dtype} (largest finite {torch.finfo(h.dtype).max:.3g})"
        )
    diagonal = h.diagonal()
    dead = diagonal == 0
    h[dead, dead] = 1
    diagonal.add_(damp * float(diagonal.mean()))
    try:
        lower = torch.linalg.cholesky(h)
        inverse = torch.cholesky_inverse(lower)
        upper: Tensor = torch.linalg.cholesky(inverse, upper=True)
    except RuntimeError:  # torch.linalg.LinAlgError
        raise value_error(
            f"{owner}: the layer's Hessian is not positive definite with damp={damp}; "
            "expected a larger damp (or more calibration data)"
        ) from None
    return upper, dead


def _sweep_block(
    w: Tensor,
    upper: Tensor,
    live: Tensor,
    dead: Tensor,
    pruned: Tensor,
    start: int,
    stop: int,
    choose: Chooser,
    pattern: Pattern,
) -> None:
    """Prune columns [start, stop) of `w` in place, spreading each column's error over the
    columns after it; marks `pruned`."""
    block = w[:, start:stop].clone()
    factor = upper[start:stop, start:stop]
    scale = factor.diagonal() ** 2
    errors = torch.zeros_like(block)
    alive = live[:, start:stop]
    chosen = pruned[:, start:stop]
    quiet = dead[start:stop]
    group = pattern.m if isinstance(pattern, NM) else stop - start
    with _one_thread():
        _sweep_columns(block, factor, scale, errors, alive, chosen, quiet, group, start, choose)
    w[:, start:stop] = block
    w[:, stop:] -= errors @ upper[start:stop, stop:]


@contextmanager
def _one_thread() -> Iterator[None]:
    """Run the block on one thread: its many small operations lose far more to waking
    threads than they gain (about 6x on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _sweep_columns(
    block: Tensor,
    factor: Tensor,
    scale: Tensor,
    errors: Tensor,
    alive: Tensor,
    chosen: Tensor,
    quiet: Tensor,
    group: int,
    start: int,
    choose: Chooser,
) -> None:
    """The column-by-column OBS updates inside one block (see _sweep_block)."""
    for i in range(block.shape[1]):
        if i % group == 0:
            end = min(i + group, block.shape[1])
            saliency = (block[:, i:end] ** 2 / scale[i:end]).masked_fill(quiet[i:end], 0)
            chosen[:, i:end] = choose(saliency, alive[:, i:end], start + i)
        column = block[:, i]
        kept = column.masked_fill(chosen[:, i] | ~alive[:, i], 0)
        error = (column - kept) / factor[i, i]
        block[:, i:] -= error.unsqueeze(1) * factor[i, i:].unsqueeze(0)
        block[:, i] = kept
        errors[:, i] = error


def _chooser(pattern: Pattern, amount: Amount, live: Tensor, blocksize: int) -> Chooser:
    """What each block (or NM group) prunes, for the patterns SparseGPT can follow."""
    if isinstance(pattern, NM):
        pattern.check(tuple(live.shape), amount)
        if pattern.dim % 2 != 1:
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
    if isinstance(pattern, PerRow) and pattern.dim % 2 == 0:
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

        def block(saliency: Tensor, alive: Tensor, first: int) -> Tensor:
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
