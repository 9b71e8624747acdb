"""Selection kernels: which k entries of a score vector are the smallest.

Every method ranks through here, so the rule is the same everywhere: exactly
k entries are chosen, and among equal scores the lower flat index goes first.
"""

from __future__ import annotations

from torch import Tensor

from prunekit._backend import namespace

__all__ = ["smallest_k"]


def smallest_k(scores: Tensor, k: int) -> Tensor:
    """Return a bool tensor shaped like `scores`, True at its `k` smallest entries.

    Ties at the k-th value are broken by flat index, lowest first, so equal
    inputs always give equal selections. `scores` must hold no NaN.
    """
    flat = scores.reshape(-1)
    n = flat.numel()
    if not 0 <= k <= n:
        raise ValueError(f"smallest_k: k={k} is outside [0, {n}]")
    if k == 0 or k == n:
        ns = namespace(scores)
        fill = ns.zeros if k == 0 else ns.ones
        filled: Tensor = fill(scores.shape, dtype=ns.bool, device=scores.device)
        return filled
    threshold = flat.kthvalue(k)[0]
    chosen = flat < threshold
    missing = k - int(chosen.sum())
    at_threshold = flat == threshold
    if int(at_threshold.sum()) > missing:
        # Keep only the first `missing` entries equal to the threshold.
        rank = at_threshold.cumsum(0)
        at_threshold = at_threshold & (rank <= missing)
    return (chosen | at_threshold).reshape(scores.shape)
