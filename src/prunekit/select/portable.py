"""The portable path: plain tensor methods, for other frameworks and devices and small inputs."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from prunekit.core.backend import namespace
from prunekit.select import trace, tuning
from prunekit.select.sources import Source

__all__ = ["portable", "select_sorted"]


def portable(sources: Sequence[Source], k: int, magnitude: bool) -> list[Tensor]:
    """Reference-style selection with plain tensor methods: gather, kthvalue, compare."""
    trace.note("portable")
    parts, lives = [], []
    for source in sources:
        scores, alive = source()
        flat = scores.reshape(-1)
        parts.append(flat.abs() if magnitude else flat)
        live = None if alive is None else alive.reshape(-1)
        if live is not None and live.dtype != namespace(live).bool:
            live = live == 1
        lives.append(live)
    ns = namespace(parts[0])
    flat = ns.cat(parts) if len(parts) > 1 else parts[0]
    if any(live is not None for live in lives):
        live = ns.cat(
            [
                ns.ones_like(p, dtype=ns.bool) if a is None else a
                for p, a in zip(parts, lives, strict=True)
            ]
        )
        index = live.nonzero().reshape(-1)
        picked = select_sorted(flat[index], k)
        chosen = ns.zeros(flat.shape, dtype=ns.bool, device=flat.device)
        chosen[index] = picked
    else:
        chosen = select_sorted(flat, k)
    out, offset = [], 0
    for part in parts:
        out.append(chosen[offset : offset + part.numel()])
        offset += part.numel()
    return out


def select_sorted(flat: Tensor, k: int) -> Tensor:
    """The k smallest of a 1-D tensor via kthvalue (a stable sort if tiny), ties by lowest index."""
    if isinstance(flat, Tensor) and flat.numel() <= tuning.get().tiny:
        chosen_few = torch.zeros(flat.shape, dtype=torch.bool, device=flat.device)
        chosen_few[torch.argsort(flat, stable=True)[:k]] = True
        return chosen_few
    threshold = flat.kthvalue(k)[0]
    chosen = flat < threshold
    missing = k - int(chosen.sum())
    at_threshold = flat == threshold
    if int(at_threshold.sum()) > missing:
        rank = at_threshold.cumsum(0)
        at_threshold = at_threshold & (rank <= missing)
    result: Tensor = chosen | at_threshold
    return result
