"""How far one output is from another: the comparison every output check makes (compact,
remove_blocks, export's ONNX, Hugging Face and GGUF checks).

Decisions: the outputs are compared in float64. An infinity on both sides at one place, of
one sign, is no difference (``inf - inf`` is NaN: a model masking logits with ``-inf`` would
never pass); an infinity against a finite value or the other infinity is an infinite one; a
NaN on either side makes the difference NaN, which no tolerance passes. The scale is the
largest finite reference value, so an infinite output never lets a difference pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["larger", "largest_difference", "largest_over", "relative_difference"]


def largest_difference(expected: Tensor, found: Tensor) -> tuple[float, float]:
    """The largest difference of `found` from `expected` and the largest finite magnitude of
    `expected`.

    Args:
        expected: the reference output.
        found: the output compared with it, of the same shape.

    Returns:
        (largest ``|found - expected|``, equal infinities counting 0 and NaN on either side
        making it NaN; largest finite ``|expected|``), both 0.0 for empty tensors.

    Raises:
        ValueError: the shapes differ (an internal error: callers compare shapes first).
    """
    if expected.shape != found.shape:
        raise ValueError(
            f"largest_difference: shapes {tuple(expected.shape)} and {tuple(found.shape)} "
            "differ; expected outputs of one shape"
        )
    if not expected.numel():
        return 0.0, 0.0
    x, y = expected.detach().double(), found.detach().double()
    gap = torch.where(torch.isinf(x) & (x == y), 0.0, (x - y).abs())
    diff = float("nan") if bool(gap.isnan().any()) else float(gap.max())
    finite = x[torch.isfinite(x)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    return diff, scale


def largest_over(pairs: Iterable[tuple[Tensor, Tensor]]) -> tuple[float, float]:
    """``largest_difference`` over several outputs: the largest difference and the largest
    finite magnitude of any of them (NaN where any difference is NaN).

    Args:
        pairs: (expected, found) per output, each pair of one shape.

    Returns:
        (largest difference, largest finite expected magnitude); (0.0, 0.0) for no pairs.
    """
    diff = scale = 0.0
    for expected, found in pairs:
        one, largest = largest_difference(expected, found)
        diff, scale = larger(diff, one), larger(scale, largest)
    return diff, scale


def relative_difference(found: Tensor, expected: Tensor) -> float:
    """The largest difference over the largest finite expected value.

    Args:
        found: the output compared.
        expected: the reference output.

    Returns:
        ``largest_difference`` over its scale: 0.0 where they agree (equal infinities too),
        infinite where they disagree and the scale is 0, where the shapes differ or where
        either side holds a NaN.
    """
    if found.shape != expected.shape:
        return math.inf
    diff, scale = largest_difference(expected, found)
    if diff != diff:
        return math.inf
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0 else math.inf


def larger(a: float, b: float) -> float:
    """The larger of two differences; NaN where either is (Python's max drops a NaN in its
    second argument).

    Args:
        a: a difference.
        b: another.

    Returns:
        NaN if either is NaN, else the larger.
    """
    return float("nan") if a != a or b != b else max(a, b)
