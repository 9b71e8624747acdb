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
        self.weights: list[tuple[Tensor, int]] = []  # (weight, output positions it made)

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
            self.weights.append((weight, out.numel() // max(weight.shape[0], 1)))
        elif name == "linear" and len(args) > 1:
            self.total += out.numel() * args[1].shape[1]
            self.weights.append((args[1], out.numel() // max(args[1].shape[0], 1)))
        elif name == "addmm" and len(args) > 2:  # Hugging Face's Conv1D
            self.total += out.numel() * args[1].shape[-1]
            self.weights.append((args[2], out.numel() // max(args[2].shape[-1], 1)))
        elif name in ("matmul", "bmm", "mm", "__matmul__") and len(args) > 1:
            self.total += out.numel() * args[0].shape[-1]
        return out


def count_macs(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Multiply-accumulates of convolutions, linear layers and matrix products in one forward."""
    counter = _Macs()
    with torch.no_grad(), counter:
        model(*args, **kwargs)
    return counter.total


def macs_per_entry(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[
    int, int
]:  # fmt: skip
    """How many multiply-accumulates each weight entry makes in one forward, by the id of the
    Parameter (its ``_orig`` when pruned): the output positions of the convolutions and
    linear layers (Hugging Face's Conv1D too) that ran with it as their weight. A weight
    that such an op did not take as it is (one sliced first, as nn.MultiheadAttention does
    with its in_proj_weight) is not found."""
    counter = _Macs()
    with torch.no_grad(), counter:
        model(*args, **kwargs)
    uses: dict[int, int] = {}
    for weight, count in counter.weights:
        uses[id(weight)] = uses.get(id(weight), 0) + count
    found: dict[int, int] = {}
    seen: set[tuple[int, int]] = set()  # a tied Parameter is held by several modules
    for module in model.modules():
        for name, param in module._parameters.items():
            shown = getattr(module, name.removesuffix("_orig"), None) if param is not None else None
            if not isinstance(shown, Tensor) or (id(param), id(shown)) in seen:
                continue
            seen.add((id(param), id(shown)))
            if uses.get(id(shown)):
                found[id(param)] = found.get(id(param), 0) + uses[id(shown)]
    return found


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
