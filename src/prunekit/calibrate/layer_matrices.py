"""The layers whose weight the calibrated criteria prune, each seen as a matrix per group:
output rows x input columns, applied to the rows of the layer's input.

- ``nn.Linear``: the weight (out, in) as it is.
- Hugging Face's ``Conv1D`` (GPT-2's ``c_attn``, ``c_fc``, ...): ``x @ W``, so its weight is
  stored (in, out), the transpose of a Linear's; patterns named for a Linear ('row', 'N:M'
  along the input) are turned to fit (`oriented`).
- ``nn.Conv1d/2d/3d``: the input's patches (one row per output position, columns ordered
  kernel position first, input channel last) times the weight as (out, positions x
  channels); a grouped convolution (depthwise too) is one such matrix per group, with
  statistics of its own input channels.
- ``nn.MultiheadAttention``'s ``in_proj_weight`` (the fused query, key and value
  projections, (3 x embed, embed)) on self-attention: the three read one input.
- ``nn.MultiheadAttention``'s ``out_proj.weight``: the attention reads it without calling
  out_proj (``F.multi_head_attention_forward`` takes the weight), so no hook on out_proj
  sees its input, the heads' output. While `out_proj_called` is entered, the attention
  computes that output with an identity projection and calls out_proj on it: the
  statistics are out_proj's own (its `reader`), taken as any Linear's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from prunekit.calibrate.batches import calls_back
from prunekit.core.errors import value_error
from prunekit.patterns import NM, Pattern, PerRow

__all__ = [
    "OUT_PROJ",
    "calibrates",
    "entry_norms",
    "features",
    "from_matrices",
    "layer_input",
    "matrices",
    "oriented",
    "out_proj_called",
    "reader",
    "tokens_first",
    "width",
]

OUT_PROJ = "out_proj.weight"
"""A MultiheadAttention's out_proj weight, as the attention module names it."""

_TOKENS_FIRST: set[int] = set()
"""The out_projs (ids) that `out_proj_called` calls on the heads' output of an attention
without batch_first: (tokens, batch, features)."""


def _is_conv1d_hf(module: nn.Module) -> bool:
    """Hugging Face's Conv1D, recognized without importing transformers."""
    return any(cls.__name__ == "Conv1D" for cls in type(module).__mro__) and all(
        isinstance(getattr(module, a, None), int) for a in ("nf", "nx")
    )


def _is_conv(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.conv._ConvNd) and not module.transposed


def calibrates(module: nn.Module, name: str) -> bool:
    """Whether ``module.<name>`` is a weight the calibrated criteria prune."""
    if isinstance(module, nn.MultiheadAttention):
        if name == OUT_PROJ:
            return isinstance(module.out_proj, nn.Linear)
        return name == "in_proj_weight" and module._qkv_same_embed_dim
    if name != "weight":
        return False
    return isinstance(module, nn.Linear) or _is_conv1d_hf(module) or _is_conv(module)


def reader(module: nn.Module, name: str) -> nn.Module:
    """The module whose input ``module.<name>`` multiplies, which the statistics hook: a
    MultiheadAttention's out_proj for its `OUT_PROJ` (called inside `out_proj_called`),
    else `module` itself."""
    if isinstance(module, nn.MultiheadAttention) and name == OUT_PROJ:
        found: nn.Module = module.out_proj
        return found
    return module


@contextmanager
def out_proj_called(targets: Iterable[tuple[nn.Module, str]]) -> Iterator[None]:
    """While entered, each MultiheadAttention of `targets` whose `OUT_PROJ` is one calls its
    out_proj: the attention runs with an identity projection in its place (no bias), giving
    the heads' output, which out_proj is then called on. The attention's output is the same
    (the identity's products are exact) and out_proj's hooks see its input. Each
    attention's forward is its own again on exit."""
    attentions = {
        id(m): m for m, name in targets if isinstance(m, nn.MultiheadAttention) and name == OUT_PROJ
    }
    saved: list[tuple[nn.Module, Any]] = []
    marked: list[int] = []  # the out_projs this call marks as reading (tokens, batch)
    try:
        for attention in attentions.values():
            holder: nn.Module = attention  # its forward is a Callable attribute there
            saved.append((holder, holder.__dict__.get("forward")))
            holder.forward = _calling_out_proj(attention, attention.forward)
            if not attention.batch_first and id(attention.out_proj) not in _TOKENS_FIRST:
                _TOKENS_FIRST.add(id(attention.out_proj))
                marked.append(id(attention.out_proj))
        yield
    finally:
        _TOKENS_FIRST.difference_update(marked)
        for attention, own in reversed(saved):
            del attention.forward
            if own is not None:
                attention.forward = own


class _Identity(nn.Module):
    """An out_proj that leaves its input as it is, for the attention to read in place of
    the real one: an identity weight, a zero bias (or none)."""

    def __init__(self, real: nn.Module) -> None:
        super().__init__()
        weight = getattr(real, "weight")  # noqa: B009 (the current values: masked if pruned)
        self.weight = torch.eye(weight.shape[1], dtype=weight.dtype, device=weight.device)
        bias = getattr(real, "bias", None)
        self.bias = None if bias is None else torch.zeros_like(bias)


def tokens_first(module: nn.Module) -> bool:
    """Whether `module` reads a token-shaped input as (tokens, batch, features): a
    MultiheadAttention without batch_first (its query), or the out_proj of one while
    `out_proj_called` calls it on the heads' output.

    Args:
        module: a layer whose input statistics are taken.

    Returns:
        True for those two; False for any other module (batch first).
    """
    if isinstance(module, nn.MultiheadAttention):
        return not module.batch_first
    return id(module) in _TOKENS_FIRST


def _calling_out_proj(attention: nn.MultiheadAttention, forward: Any) -> Any:
    identity: list[_Identity] = []  # made at the first call, from the weight's dtype

    def call(*args: Any, **kwargs: Any) -> Any:
        real = attention._modules["out_proj"]
        assert real is not None
        if not identity:
            identity.append(_Identity(real))
        attention._modules["out_proj"] = identity[0]
        try:
            heads, weights = forward(*args, **kwargs)
        finally:
            attention._modules["out_proj"] = real
        return real(heads), weights

    calls_back(call)
    return call


def width(module: nn.Module) -> tuple[int, int]:
    """(groups, columns per group) of the layer's matrices."""
    if _is_conv(module):
        assert isinstance(module, nn.modules.conv._ConvNd)
        per_group = module.in_channels // module.groups
        return module.groups, per_group * math.prod(module.kernel_size)
    if isinstance(module, nn.MultiheadAttention):
        return 1, module.embed_dim
    if _is_conv1d_hf(module):
        return 1, int(getattr(module, "nx"))  # noqa: B009
    features = getattr(module, "in_features", None)
    assert isinstance(features, int), f"{type(module).__name__} has no in_features"
    return 1, features


def layer_input(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    """The tensor a layer's weight multiplies, from the arguments of its forward call."""
    if isinstance(module, nn.MultiheadAttention):
        names = ("query", "key", "value")
        given = [*args[:3], *(kwargs.get(n) for n in names[len(args[:3]) :])]
        if not (given[0] is given[1] is given[2]):
            raise value_error(
                "calibration: MultiheadAttention's in_proj_weight is calibrated on "
                "self-attention, where query, key and value are one tensor; got three "
                "(exclude 'in_proj_weight', or prune it with method='l1')"
            )
        query: Tensor = given[0]
        return query
    x: Tensor = args[0] if args else next(iter(kwargs.values()))
    return x


def features(module: nn.Module, x: Tensor) -> Tensor:
    """The input as rows of the matrices' columns: (rows, groups, columns per group)."""
    groups, columns = width(module)
    if _is_conv(module):
        assert isinstance(module, nn.modules.conv._ConvNd)
        x = _patches(module, x)
    return x.detach().reshape(-1, groups, columns)


def _patches(conv: nn.modules.conv._ConvNd, x: Tensor) -> Tensor:
    """(..., groups x positions x channels per group): what each output position reads,
    kernel position first and input channel last, as `matrices` orders the weight."""
    spatial = len(conv.kernel_size)
    if x.dim() == spatial + 1:  # unbatched
        x = x.unsqueeze(0)
    pad = conv._reversed_padding_repeated_twice
    if any(pad):
        mode = "constant" if conv.padding_mode == "zeros" else conv.padding_mode
        x = F.pad(x, pad, mode=mode)
    for i, (k, s, d) in enumerate(zip(conv.kernel_size, conv.stride, conv.dilation, strict=True)):
        x = x.unfold(2 + i, d * (k - 1) + 1, s)[..., ::d]
    # (N, C, *outputs, *kernel) -> (N, *outputs, groups, *kernel, C / groups)
    n, c = x.shape[:2]
    outputs = x.shape[2 : 2 + spatial]
    kernel = x.shape[2 + spatial :]
    x = x.reshape(n, conv.groups, c // conv.groups, *outputs, *kernel)
    order = [0, *range(3, 3 + spatial), 1, *range(3 + spatial, 3 + 2 * spatial), 2]
    return x.permute(order).reshape(-1, conv.groups, math.prod(kernel) * (c // conv.groups))


def matrices(module: nn.Module, weight: Tensor) -> Tensor:
    """`weight` as (groups, out per group, columns per group), in `features`' column order."""
    groups, columns = width(module)
    if _is_conv1d_hf(module):
        weight = weight.T
    elif _is_conv(module):
        weight = weight.movedim(1, -1)
    return weight.reshape(groups, -1, columns)


def from_matrices(module: nn.Module, found: Tensor, shape: torch.Size) -> Tensor:
    """The inverse of `matrices`: a tensor of the weight's `shape`."""
    if _is_conv1d_hf(module):
        return found.reshape(shape[1], shape[0]).T
    if _is_conv(module):
        moved = (shape[0], *shape[2:], shape[1])
        return found.reshape(moved).movedim(-1, 1)
    return found.reshape(shape)


def entry_norms(module: nn.Module, norms: Tensor, shape: torch.Size) -> Tensor:
    """Per-column norms (groups, columns) as the norm of what each weight entry multiplies,
    a tensor broadcast to the weight's `shape`."""
    groups, columns = norms.shape
    rows = shape[1] if _is_conv1d_hf(module) else shape[0]
    spread = norms.reshape(groups, 1, columns).expand(groups, rows // groups, columns)
    return from_matrices(module, spread, shape)


def oriented(module: nn.Module, pattern: Pattern) -> Pattern:
    """`pattern` as it reads on this layer's weight: for Hugging Face's Conv1D, whose weight
    is a Linear's transposed, a 'row' and an 'N:M' pattern of a 2-D weight swap dims."""
    if not _is_conv1d_hf(module):
        return pattern
    if type(pattern) is PerRow and pattern.dim in (0, -2):
        return PerRow(dim=1)
    if type(pattern) is NM and pattern.dim in (1, -1):
        return NM(pattern.n, pattern.m, dim=0)
    return pattern
