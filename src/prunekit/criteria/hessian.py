"""The layer Hessian's factors and inverses: the damped Cholesky factor that compensation
solves with and the 'obs' group criterion inverts, and SparseGPT's upper factor of the
inverse.

The Hessian is the mean of X^T X over a layer's calibration inputs
(``calibration.InputStatistics.hessian``). Two damping policies, as the callers need:
``damped_cholesky`` adds damp x the mean diagonal (compensation: the median) and raises it
tenfold where factoring fails (compensation and 'obs' only rank or solve, and must not stop
on a borderline matrix); ``inverse_factor`` (SparseGPT) damps once, sets the inputs that
never fired apart, and tells the caller to raise its damp when that is not enough.
"""

from __future__ import annotations

import torch
from torch import Tensor

from prunekit.core.errors import type_error, value_error

__all__ = [
    "damp_", "damped", "damped_cholesky", "damped_inverse", "diagonal_scale", "inverse_factor",
]  # fmt: skip


def damped_cholesky(a: Tensor, damp: float, owner: str, *, median: bool = False) -> Tensor:
    """The Cholesky factor of `a` + damp x its mean diagonal x I (`a` symmetric positive
    semi-definite), the damping raised tenfold (up to 1e6 times) where factorization fails.
    With `median`, damp x the median of the diagonal instead (its mean where the median is
    0): a scale that a few features of huge second moment do not set.

    Raises:
        RuntimeError: `a` is not positive definite even then (a NaN or inf in it).
    """
    scale = diagonal_scale(a, median)
    eye = torch.eye(a.shape[0], dtype=a.dtype)
    level = damp * scale if scale > 0 else damp
    for _ in range(7):
        found = torch.linalg.cholesky_ex(a + level * eye)
        if int(found.info) == 0:
            factor: Tensor = found.L
            return factor
        level = max(level, 1e-12) * 10
    raise RuntimeError(f"{owner}: the input Hessian is not positive definite even damped")


def diagonal_scale(a: Tensor, median: bool = False) -> float:
    """The mean of `a`'s diagonal, or with `median` its median (the mean where that is 0);
    0 for an empty `a`."""
    if not a.numel():
        return 0.0
    diagonal = a.diagonal()
    middle = float(diagonal.median()) if median else 0.0
    return middle if middle > 0 else float(diagonal.mean())


def damped_inverse(hessian: Tensor, damp: float, owner: str) -> Tensor:
    """The inverse of `hessian` damped as ``damped_cholesky`` does, in float64."""
    return torch.cholesky_inverse(damped_cholesky(hessian.to(torch.float64), damp, owner))


def damped(hessian: Tensor, damp: float) -> Tensor:
    """`hessian` as ``inverse_factor`` damps it: the inputs that never fired (a zero
    diagonal) get 1 on the diagonal, then every diagonal entry damp x the mean diagonal.

    Args:
        hessian: a symmetric positive semi-definite matrix (the mean of X^T X).
        damp: the share of the mean diagonal added to the diagonal.

    Returns:
        A new matrix; `hessian` is not changed.
    """
    return damp_(hessian.detach().clone(), damp)


def damp_(hessian: Tensor, damp: float) -> Tensor:
    """``damped`` in place: `hessian` itself damped (the same values as ``damped``'s).

    Args:
        hessian: a symmetric positive semi-definite matrix, overwritten.
        damp: the share of the mean diagonal added to the diagonal.

    Returns:
        `hessian`.
    """
    diagonal = hessian.diagonal()
    dead = diagonal == 0
    hessian[dead, dead] = 1
    diagonal.add_(damp * float(diagonal.mean()))
    return hessian


def inverse_factor(
    hessian: Tensor, damp: float, owner: str, in_place: bool = False
) -> tuple[Tensor, Tensor]:
    """The upper Cholesky factor of (H + damp * mean(diag H) * I)^-1, and which inputs
    never fired (a zero diagonal: their weights cost nothing to prune). With `in_place`,
    `hessian` is damped in place (``damp_``: no copy of it made), else not changed.

    Raises:
        TypeError: `hessian` is not float32 or float64 (torch factors no other on a CPU).
        ValueError: `hessian` holds a NaN or inf, or is not positive definite damped.
    """
    h = hessian.detach()
    if h.dtype not in (torch.float32, torch.float64):
        raise type_error(
            f"{owner}: the layer's Hessian is {str(h.dtype).removeprefix('torch.')}; expected "
            "float32 or float64 (its factors are computed, and the weights updated, in its "
            "dtype)"
        )
    # The sum is finite only where every entry is (an inf or a NaN makes it inf or NaN),
    # and takes a 30th of the time of isfinite over all entries, checked only if it is not.
    if not bool(torch.isfinite(h.sum())) and not bool(torch.isfinite(h).all()):
        kind = "inf" if bool(torch.isinf(h).any()) else "NaN"
        raise value_error(
            f"{owner}: the layer's Hessian (mean of X^T X over its inputs) holds {kind} "
            f"entries: the squares of its inputs overflow {h.dtype} (or the inputs were not "
            "finite), which no damp can fix; expected calibration inputs whose squares fit "
            f"{h.dtype} (largest finite {torch.finfo(h.dtype).max:.3g})"
        )
    dead = h.diagonal() == 0
    h = damp_(h, damp) if in_place else damped(h, damp)
    # cholesky_ex: a matrix that is not positive definite is told by `info`; any error
    # torch raises is no user's and propagates as it is
    found = torch.linalg.cholesky_ex(h)
    del h  # each in x in matrix let go once the next is made: two held at a time
    if int(found.info) == 0:
        inverse = torch.cholesky_inverse(found.L)
        del found
        found = torch.linalg.cholesky_ex(inverse, upper=True)
        del inverse
    if int(found.info) != 0:
        raise value_error(
            f"{owner}: the layer's Hessian is not positive definite with damp={damp}; "
            "expected a larger damp (or more calibration data)"
        )
    upper: Tensor = found.L
    return upper, dead
