"""Random: entries (or channels) chosen uniformly at random."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from torch import Tensor

from prunekit.core.backend import namespace, seeded_rand
from prunekit.core.naming import TensorRef
from prunekit.criteria.criterion import Criterion
from prunekit.select import Source

__all__ = ["Random"]


class Random(Criterion):
    """Uniform noise as scores, drawn from the framework's global generator, so
    ``torch.manual_seed`` makes a pruning repeatable.

    Attributes:
        by_magnitude: True: noise in [0, 1) is never negative.
    """

    by_magnitude = True  # noise is never negative
    _compact = True

    def scores(self, values: Tensor, target: TensorRef = None) -> Tensor:
        noise: Tensor = namespace(values).rand(values.shape, device=values.device)
        return noise

    def channel_scores(self, values: Tensor, dim: int, target: TensorRef = None) -> Tensor:
        noise: Tensor = namespace(values).rand(values.shape[dim], device=values.device)
        return noise

    def _compact_sources(self, values: Sequence[Tensor], counts: Sequence[int]) -> list[Source]:
        """Noise for the `counts` competing entries of each tensor: one draw for one
        tensor; for several, drawn again identically on every pass from per-tensor seeds
        instead of kept in memory."""
        ns = namespace(values[0])
        device = values[0].device
        if len(values) == 1:
            noise = ns.rand(counts[0], device=device)
            return [lambda: (noise, None)]
        seed = int(ns.randint(0, 2**62, (1,)))
        return [_noise_source(ns, n, seed + i, device) for i, n in enumerate(counts)]


def _noise_source(ns: ModuleType, count: int, seed: int, device: Any) -> Source:
    def draw() -> tuple[Tensor, None]:
        return seeded_rand(ns, count, seed, device), None

    return draw
