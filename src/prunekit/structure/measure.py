"""Parameters, multiply-accumulates and CPU latency of a model on given inputs."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode


def count_params(model: nn.Module) -> int:
    """Entries of the model's parameters (a pruned tensor counts once, as its ``_orig``)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


class _Macs(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_function__(
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:  # fmt: skip
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if not isinstance(out, Tensor) or not args:
            return out
        if name in ("conv1d", "conv2d", "conv3d") and len(args) > 1:
            weight = args[1]
            self.total += out.numel() * math.prod(weight.shape[1:])
        elif name == "linear" and len(args) > 1:
            self.total += out.numel() * args[1].shape[1]
        elif name == "addmm" and len(args) > 2:  # Hugging Face's Conv1D
            self.total += out.numel() * args[1].shape[-1]
        elif name in ("matmul", "bmm", "mm", "__matmul__") and len(args) > 1:
            self.total += out.numel() * args[0].shape[-1]
        return out


def count_macs(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Multiply-accumulates of convolutions, linear layers and matrix products in one forward."""
    counter = _Macs()
    with torch.no_grad(), counter:
        model(*args, **kwargs)
    return counter.total


def latency_ms(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], runs: int = 10
) -> float:
    """Median wall time of one forward in milliseconds (inference mode, after one warm-up)."""
    with torch.inference_mode():
        model(*args, **kwargs)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            model(*args, **kwargs)
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)
