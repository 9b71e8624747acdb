"""Parameters, multiply-accumulates and CPU latency of a model on given inputs.

A package of its own, below every stage that reports what it changed (``compaction``,
``depth``) and the budget that plans by it: it imports nothing of ``structure``.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from prunekit.core.checks import check_number
from prunekit.core.errors import value_error

_LARGEST_EXPONENT = math.log(sys.float_info.max)  # math.exp overflows beyond it


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
        elif name in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d") and len(args) > 1:
            weight = args[1]  # (in, out / groups, *kernel): each input position meets its row
            self.total += args[0].numel() * math.prod(weight.shape[1:])
            self.weights.append((weight, args[0].numel() // max(weight.shape[0], 1)))
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
    """Multiply-accumulates of convolutions (transposed too), linear layers and matrix products
    in one forward."""
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
    """Median wall time of one forward in milliseconds (inference mode, after one warm-up);
    `runs`: the forwards timed, an int >= 1."""
    check_number(runs, "runs", "latency_ms", "an int >= 1: the forwards timed", lambda v: v >= 1,
                 integral=True)  # fmt: skip
    with torch.inference_mode():
        model(*args, **kwargs)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            model(*args, **kwargs)
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


@dataclass(frozen=True)
class Paired:
    """Two states of one model timed alternately (before, after, before, after, ...), so a
    load that comes and goes on the machine weighs on both alike.

    `before_ms`/`after_ms`: the median time of one forward of each; `ratio`: the median of
    the per-pair ratios before / after (above 1: after is faster); `low`/`high`: the
    quartiles of those ratios (both `ratio` with one pair)."""

    before_ms: float
    after_ms: float
    ratio: float
    low: float
    high: float
    pairs: int

    def verdict(self) -> str:
        """'N.NNx faster', 'N.NNx slower', or 'no clear difference' when the middle half of
        the pairs' ratios holds 1 (both ways happened often)."""
        if self.low > 1.0:
            return f"{self.ratio:.2f}x faster"
        if self.high < 1.0:
            return f"{1.0 / self.ratio:.2f}x slower"
        return f"no clear difference ({self.ratio:.2f}x)"

    def __str__(self) -> str:
        return (
            f"{self.before_ms:.2f} ms -> {self.after_ms:.2f} ms, {self.verdict()} (median of "
            f"{self.pairs} alternated pairs; middle half {self.low:.2f}x-{self.high:.2f}x)"
        )


def paired_latency(
    before: Callable[[], None],
    after: Callable[[], None],
    forward: Callable[[], Any],
    runs: int,
    clock: Callable[[], float] = time.perf_counter,
) -> Paired:
    """Time `forward()` `runs` times after `before()` and as often after `after()`,
    alternately, after one warm-up of each; the switches are not timed. `clock` gives
    seconds."""
    times: tuple[list[float], list[float]] = ([], [])
    for index in range(runs + 1):
        for switch, found in zip((before, after), times, strict=True):
            switch()
            start = clock()
            forward()
            if index:  # the first round warms up
                found.append(clock() - start)
    ratios = [max(a, 1e-12) / max(b, 1e-12) for a, b in zip(*times, strict=True)]
    ratio = statistics.median(ratios)
    quartiles = statistics.quantiles(ratios, n=4, method="inclusive") if runs > 1 else [ratio] * 3
    return Paired(
        1000 * statistics.median(times[0]), 1000 * statistics.median(times[1]), ratio,
        min(quartiles[0], ratio), max(quartiles[2], ratio), runs,
    )  # fmt: skip


def perplexity(model: nn.Module, windows: Sequence[Tensor]) -> float:
    """The perplexity of a causal language model on windows of token ids: exp of the mean
    loss of predicting each token from those before it in its window.

    Args:
        model: a causal LM whose forward takes ``input_ids`` and returns logits (a tensor, or
            an output with ``logits``), one row of the vocabulary per position.
        windows: 1-D tensors of token ids, each of at least 2 tokens.

    Returns:
        The perplexity (tokens weigh alike across windows): inf beyond the largest float
        (a mean loss above about 709), NaN where a loss is NaN.

    Raises:
        ValueError: no window, or a window of fewer than 2 tokens.
    """
    if not windows or any(w.dim() != 1 or len(w) < 2 for w in windows):
        raise value_error(
            f"perplexity: windows of lengths {[tuple(w.shape) for w in windows][:4]}; expected "
            "at least one 1-D window of 2 or more token ids"
        )
    total, count = 0.0, 0
    with torch.inference_mode():
        for ids in windows:
            output = model(input_ids=ids[None])
            logits = output if isinstance(output, Tensor) else output.logits
            losses = F.cross_entropy(logits[0, :-1].float(), ids[1:], reduction="sum")
            total, count = total + float(losses), count + len(ids) - 1
    mean = total / count
    return math.exp(mean) if mean < _LARGEST_EXPONENT else mean * math.inf  # NaN stays NaN
