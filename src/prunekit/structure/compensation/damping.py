"""The damping of compensation's least-squares update: from the rows the consumer's
statistics hold (the default, ``ROWS``), or chosen per consumer by its error on held-out
calibration batches (``AUTO``).

By rows: a least-squares fit of n features on r rows fits the rows' noise the more, the fewer
rows each feature has, so the damping is ``ROWS_SCALE`` x n / r, kept between ``LIGHTEST``
and ``DAMP`` (``by_rows``). A convolution read as patches takes ``LIGHTEST``: its rows are
output positions, and a light damping did best at every depth measured.

Held out: the calibration batches are split in two folds (alternate batches). For each damping of
``GRID`` (relative to the median diagonal of the kept block, as ``least_squares_update``
takes it), the update is fitted on one fold's input moments and its output error measured
on the other fold's, and the other way round; the errors add up. The error of a change
needs no tokens, only the held-out fold's second moment: the layer's output moves by
E x, with E the removed columns' weights, minus the kept columns' change (and the bias's),
so its mean square over the fold's inputs is trace(E H E^T) with H the fold's mean of
x x^T (a constant input column added where the bias moves). The damping of least error is
then used on all the batches; where none beats leaving the weights as they are (no update:
E is the removed columns alone), the consumer is left.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor, nn

from prunekit.core.errors import type_error, value_error, warn_caller
from prunekit.criteria.hessian import damped_cholesky

__all__ = [
    "AUTO", "DAMP", "GRID", "LIGHTEST", "ROWS", "ROWS_SCALE", "Moments", "Tuning", "by_median",
    "by_rows", "check_damping", "choose", "held_out_errors", "least_squares_update", "pooled",
]  # fmt: skip

DAMP = 0.3
"""Damping of the solve, relative to the median of the Hessian's diagonal (a convolution's: its
mean; see ``by_median``). Strong on purpose:
with a few thousand calibration tokens for an input of 1536 features (a small LLM's MLP),
a light damping fits the calibration tokens and raises the error on other tokens (measured
on SmolLM2-135M's down projections: see ``benchmarks/llm_structure.py``); a third of the
mean diagonal (the scale then) lowered the held-out error at every calibration size tried
(512 to 4096 tokens), 1 % raised it below 4096. The most that ``by_rows`` gives."""

ROWS = "rows"
ROWS_SCALE = 0.6
"""``by_rows``' damping per feature a row serves: 0.6 x features / rows. On SmolLM2-135M
with 16-32 k calibration tokens (10-21 rows per feature of a down projection) it gives the
0.06-0.03 that did best on its worst text domain at 20 % and 35 % (``benchmarks/domains_llm.py``),
and with the 2-4 k tokens a call is often given (1.3-2.7 rows per feature) 0.3-0.22, near
the constant ``DAMP`` chosen for them."""
LIGHTEST = 0.01
"""The least damping ``by_rows`` gives, however many rows, and a convolution's read as
patches. EfficientNet-Lite0, 30 % of its expansion widths, ``compensate=True``, 64
calibration crops, top-1 agreement with the dense model on crops of the same photos: 30.1 %
at 0.3, 43.4 % by rows, 49.2 % at 0.01 (50.8 % at 0.003); on photos never calibrated on,
5.9 %, 8.2 % and 13.3 % (``benchmarks/cnn_structure.py --comp-damping``)."""


AUTO = "auto"
GRID = (1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0)
"""The dampings tried, relative to the median (``by_median``) diagonal of the kept block of
the input's second moment: a log scale from a light touch (1e-3: nearly the plain
least-squares fit) to one that shrinks the update strongly (3: about a quarter of it where
the inputs are white)."""
T = TypeVar("T")
MAX_ROWS = 64
"""At most this many output rows (evenly spaced) measure the error of each damping: the
error is a sum over rows that all share the input, and the fit costs in proportion."""


@dataclass
class Moments:
    """A consumer's input moments over some calibration rows: the mean of x x^T, the mean
    of x (both float64 or float32; a leading dim per group of a grouped convolution), and
    how many rows they hold."""

    hessian: Tensor
    mean: Tensor
    rows: int


def pooled(parts: Sequence[Moments]) -> Moments:
    """The moments of all the parts' rows together (row-weighted means)."""
    rows = sum(p.rows for p in parts)
    weights = [p.rows / max(rows, 1) for p in parts]
    hessian = sum((w * p.hessian.to(torch.float64) for w, p in zip(weights, parts, strict=True)),
                  torch.zeros_like(parts[0].hessian, dtype=torch.float64))  # fmt: skip
    mean = sum((w * p.mean.to(torch.float64) for w, p in zip(weights, parts, strict=True)),
               torch.zeros_like(parts[0].mean, dtype=torch.float64))  # fmt: skip
    return Moments(hessian, mean, rows)


def least_squares_update(
    weight: Tensor,
    hessian: Tensor,
    removed: Sequence[int],
    kept: Sequence[int],
    mean: Tensor | None = None,
    damp: float = DAMP,
    median: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """The change of the kept columns (and of the bias) that best replaces removed columns.

    Args:
        weight: (rows, n), the consumer's weight with input features as columns.
        hessian: (n, n), the mean of x x^T over the calibration inputs.
        removed: the columns that go.
        kept: the columns that stay (the others are neither used nor changed).
        mean: (n,), the mean input; given, a constant input column is fitted too and the
            second value returned is the change of the bias.
        damp: added to the diagonal of the kept block, relative to its median (its mean
            where the median is 0), or with `median` False to its mean.
        median: the scale of `damp` (``by_median`` says which a consumer takes).

    Returns:
        (rows, len(kept)) to add to ``weight[:, kept]`` and (rows,) to add to the bias (None
        without `mean`), float64.
    """
    w = weight.detach().to(torch.float64)
    h = hessian.detach().to(torch.float64)
    if mean is not None:
        m = mean.detach().to(torch.float64).reshape(-1, 1)
        corner = torch.ones(1, 1, dtype=torch.float64)
        h = torch.cat([torch.cat([h, m], 1), torch.cat([m.T, corner], 1)], 0)
        kept = [*kept, h.shape[0] - 1]
    k = torch.tensor(list(kept), dtype=torch.long)
    r = torch.tensor(list(removed), dtype=torch.long)
    rows = w.shape[0]
    if len(r) == 0 or len(k) == 0:
        delta = torch.zeros(rows, len(k), dtype=torch.float64)
    else:
        right = h[k][:, r] @ w[:, r].T  # (|K|, rows)
        delta = _damped_solve(h[k][:, k], right, damp, median).T
    if mean is None:
        return delta, None
    return delta[:, :-1], delta[:, -1]


def by_rows(rows: int, features: int) -> float:
    """The damping for a consumer whose statistics hold `rows` rows of `features` features:
    ``ROWS_SCALE`` x features / rows, between ``LIGHTEST`` and ``DAMP`` (``DAMP`` without
    rows)."""
    if rows <= 0:
        return DAMP
    return min(DAMP, max(LIGHTEST, ROWS_SCALE * features / rows))


def by_median(module: nn.Module) -> bool:
    """Whether a consumer's damping is a share of the median of its input's diagonal (a
    Linear-like layer reading tokens' features) or of the mean (a convolution). The median
    is a scale a few features of huge energy do not set: in one block of SmolLM2-135M the
    down projection reads 99.9 % of its input's energy from one token of each window (its
    attention sink), its mean diagonal is 1,034 times its median, and a share of the mean
    damped every other feature that much more (with the median the worst text domain gained
    2-3 % at 20, 35 and 50 %; all-MiniLM-L6-v2 moved by 0.005 at most). A convolution's
    channels hold no such tokens, and EfficientNet-Lite0 lost with the median (top-1
    agreement 49.2 % -> 46.1 %), so it keeps the mean."""
    return not isinstance(module, nn.modules.conv._ConvNd)


def _damped_solve(a: Tensor, b: Tensor, damp: float, median: bool) -> Tensor:
    """x with (a + damp x the median, or mean, of a's diagonal) x = b, `a` symmetric
    positive semi-definite: a Cholesky solve."""
    return torch.cholesky_solve(b, damped_cholesky(a, damp, "compensation", median=median))


def check_damping(damping: object, owner: str) -> float | str:
    """`damping` as compensation takes it: 'rows', 'auto' or a finite number > 0 (a float).

    Raises:
        TypeError: neither a string nor a real number (a bool included).
        ValueError: another string, or a number that is not finite or not > 0.
    """
    if isinstance(damping, str):
        if damping not in (ROWS, AUTO):
            raise value_error(
                f"{owner}: invalid damping={damping!r}; expected 'rows' (from the calibration "
                "rows per input feature of each layer), 'auto' (chosen per layer on held-out "
                "calibration batches) or a number > 0"
            )
        return damping
    if isinstance(damping, bool) or not isinstance(damping, numbers.Real):
        raise type_error(
            f"{owner}: damping must be 'rows', 'auto' or a number > 0, not "
            f"{type(damping).__name__} ({damping!r})"
        )
    if not math.isfinite(float(damping)) or damping <= 0:
        raise value_error(
            f"{owner}: invalid damping={damping!r}; expected 'rows', 'auto' or a finite number "
            "> 0 (relative to the median diagonal of the input's second moment; a convolution's "
            "mean)"
        )
    return float(damping)


def held_out_errors(
    weight: Tensor,
    folds: Sequence[Moments],
    removed: Sequence[int],
    kept: Sequence[int],
    bias: bool,
    grid: Sequence[float] = GRID,
    median: bool = True,
) -> tuple[Tensor, float]:
    """The held-out output error of the update at each damping of `grid`, and without it.

    Each fold in turn is held out: the update is fitted on the pooled moments of the
    others and its mean squared output change measured on the held-out fold's; the errors
    of the folds add up.

    Args:
        weight: (rows, n), the consumer's weight, input features as columns.
        folds: two or more `Moments` of its input, (n, n) and (n,) each.
        removed: the columns that go.
        kept: the columns that stay and change.
        bias: whether the bias moves too (the constant column of ``least_squares_update``).
        grid: the dampings, relative to the median (or mean) diagonal of the kept block.
        median: the scale of the dampings, as ``least_squares_update`` takes it.

    Returns:
        (len(grid),) float64 errors, and the error of leaving the weights as they are.
    """
    w = _rows(weight.detach().to(torch.float64))
    columns = torch.tensor([*removed, *kept], dtype=torch.long)
    errors = torch.zeros(len(grid), dtype=torch.float64)
    untouched = 0.0
    for index, held in enumerate(folds):
        fit = pooled([f for k, f in enumerate(folds) if k != index])
        h = _augmented(held, columns, bias)
        base = torch.zeros(w.shape[0], h.shape[0], dtype=torch.float64)
        base[:, : len(removed)] = w[:, list(removed)]
        untouched += _error(base, h)
        for g, level in enumerate(grid):
            mean = fit.mean if bias else None
            delta, shift = least_squares_update(w, fit.hessian, removed, kept, mean, level,
                                                median)  # fmt: skip
            change = base.clone()
            change[:, len(removed) : len(removed) + len(kept)] = -delta
            if shift is not None:
                change[:, -1] = -shift
            errors[g] += _error(change, h)
    return errors, untouched


def choose(errors: Tensor, untouched: float, grid: Sequence[float] = GRID) -> float | None:
    """The damping of least held-out error (the lightest among equals), or None where none
    is below `untouched` (leaving the weights as they are does as well or better)."""
    best = int(torch.argmin(errors))
    if not bool(errors[best] < untouched):  # a NaN error never wins
        return None
    return float(grid[best])


def _rows(w: Tensor) -> Tensor:
    """At most MAX_ROWS rows of `w`, evenly spaced."""
    if w.shape[0] <= MAX_ROWS:
        return w
    picked = torch.linspace(0, w.shape[0] - 1, MAX_ROWS).round().long()
    return w[picked]


def _augmented(moments: Moments, columns: Tensor, bias: bool) -> Tensor:
    """The held-out second moment over `columns` (removed, then kept), with the constant
    input column last where the bias moves."""
    h = moments.hessian.to(torch.float64)[columns][:, columns]
    if not bias:
        return h
    m = moments.mean.to(torch.float64)[columns].reshape(-1, 1)
    corner = torch.ones(1, 1, dtype=torch.float64)
    return torch.cat([torch.cat([h, m], 1), torch.cat([m.T, corner], 1)], 0)


def _error(change: Tensor, h: Tensor) -> float:
    """Mean squared output change trace(E H E^T), summed over the rows of E."""
    return float(((change @ h) * change).sum())


class Tuning:
    """The damping of one compensation and what it met: the folds its batches split into
    ('auto': alternate batches; else one fold of all), the consumers whose statistics hold
    fewer rows (calibration tokens, positions) than their input has features (their
    least-squares problem is underdetermined: what the update does there rests on the
    damping), and those where no damping beat leaving the weights (left as they were).
    ``warn`` warns once about each kind. 'auto' with one batch falls back to 'rows'."""

    def __init__(self, damping: float | str, batches: int) -> None:
        self.auto = damping == AUTO and batches >= 2
        self.level: float | None = None if isinstance(damping, str) else float(damping)
        self.single = damping == AUTO and batches < 2
        self.short: list[tuple[nn.Module, int, int]] = []  # (module, rows, features)
        self.left: list[nn.Module] = []
        self.chosen: dict[int, float] = {}  # id(module) -> the damping used

    def folds(self, items: Sequence[T]) -> list[tuple[Sequence[T], list[int]]]:
        """`items` (batches, or a block's inputs) as the folds of the held-out choice, each
        with the indices of its items."""
        if not self.auto:
            return [(items, list(range(len(items))))]
        return [(items[k::2], list(range(k, len(items), 2))) for k in (0, 1)]

    def note(self, module: nn.Module, rows: int, features: int) -> None:
        if rows < features:
            self.short.append((module, rows, features))

    def damping(
        self, module: nn.Module, errors: Tensor | None, untouched: float, rows: int, features: int,
        patches: bool = False,
    ) -> float | None:  # fmt: skip
        """The damping to update `module` with (None: leave it), from the held-out
        `errors` of ``damping.GRID`` where chosen, else the constant, ``LIGHTEST`` for a
        convolution read as `patches`, or ``by_rows``."""
        if errors is not None:
            level = choose(errors, untouched)
        elif self.level is not None:
            level = self.level
        else:
            level = LIGHTEST if patches else by_rows(rows, features)
        if level is None:
            self.left.append(module)
        else:
            self.chosen[id(module)] = level
        return level

    def warn(self, names: dict[int, str]) -> None:
        """One warning per kind of trouble, naming the first consumer and the count."""
        if self.single:
            warn_caller(
                "prune_channels: damping='auto' holds out calibration batches to choose the "
                "damping of each layer, and one batch cannot be split: used damping='rows' (from "
                "each layer's calibration rows per feature); expected two or more calibration "
                "batches"
            )
        if self.short:
            module, rows, features = self.short[0]
            most = max(features for _, _, features in self.short)
            warn_caller(
                f"prune_channels: compensate=True measured {rows} calibration rows (tokens or "
                f"positions) for {_named(names, module)}, whose input has {features} features"
                f"{_others(len(self.short))}: fewer rows than features leave the least-squares "
                "update underdetermined, resting on its damping; expected at least "
                f"{most} rows: more or longer calibration batches"
            )
        if self.left:
            warn_caller(
                f"prune_channels: compensate=True left {_named(names, self.left[0])}"
                f"{_others(len(self.left))} as they were: no damping of the least-squares "
                "update lowered their output error on held-out calibration batches; expected "
                "calibration batches that show what those layers read (more of them, or "
                "closer to the data the model will see)"
            )


def _named(names: dict[int, str], module: nn.Module) -> str:
    return names.get(id(module), type(module).__name__)


def _others(count: int) -> str:
    more = count - 1
    return f" and {more} other consumer{'s' if more > 1 else ''}" if more else ""
