"""Tracing without the arithmetic the graph never reads.

The graph is made of labels and shapes; the values of the activations only carry the forward
from op to op. So while tracing, the costly ops (linear layers, convolutions, matrix products,
attention) are not computed: each gives zeros of the shape, dtype, device and memory layout
the op gives (worked out from its arguments, checked as the op checks them). Those values are
*fake*, and so is every value computed from one. As long as fake values only flow through ops
whose output shapes and labels do not depend on values, the trace is the one computing every
op would give. An op that could read them (``bool()``, ``item()``, indices computed from the
activations, an op the graph has no value-blind handler for, a write of fake values into a
real tensor) stops the trace with `NeedValues`, and it is run again computing every op.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch import Tensor, nn

# blindness of an op's handler and output shape to the values of its operands: 'all' (blind
# to every operand), 'first' (to its first argument, a tensor or a list of them, only: a move
# replays its index tensors) or 'none'
Blind = str

# in-place ops named as dunders (other in-place ops end with one '_')
_IN_PLACE = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
             "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
             "__irshift__", "__imatmul__"}  # fmt: skip
# ops that make new values of an input's shape whatever its values are: their output is real
REAL_OUTPUT = {"zeros_like", "ones_like", "empty_like", "full_like", "new_zeros", "new_ones",
               "new_empty", "new_full"}  # fmt: skip
# moves that read the shape of their second argument only
_SHAPE_DONORS = {"expand_as", "view_as", "reshape_as"}
MIN_WORK = 1 << 16  # multiply-adds below which an op is computed (its zeros cost as much)


class NeedValues(Exception):
    """A traced op could read fake values: the trace is run again computing every op."""


@dataclass
class Fakes:
    """The tensors holding fake values while they are alive (by id), and why the trace stopped
    ('' while it has not)."""

    stopped: str = ""
    skipped: int = 0  # how many ops were not computed
    least: int = MIN_WORK  # the multiply-adds from which an op is skipped
    _held: dict[int, weakref.ref[Tensor]] = field(default_factory=dict)

    def holds(self, t: Tensor) -> bool:
        ref = self._held.get(id(t))
        return ref is not None and ref() is t

    def add(self, out: Any) -> None:
        """Mark the tensors of `out` (a tensor, or a tuple or list of them) as fake."""
        held = self._held
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, Tensor):

                def forget(_: object, key: int = id(t)) -> None:
                    held.pop(key, None)

                held[id(t)] = weakref.ref(t, forget)

    def stop(self, why: str) -> NoReturn:
        self.stopped = self.stopped or why
        raise NeedValues(why)

    def run(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
            inputs: list[Tensor], blind: Blind) -> Any:  # fmt: skip
        """`func` on these arguments (`inputs`: their tensors), skipped when costly and its
        handler is blind to values; its outputs marked fake when made from fake values.

        Raises:
            NeedValues: the op could read fake values.
        """
        fake = [t for t in inputs if self.holds(t)] if self._held else []
        if fake:
            self._check(func, name, args, kwargs, fake, blind)
        if blind == "all":
            made = skipped(func, args, kwargs, self.least)
            if made is not None:
                self.skipped += 1
                self.add(made)
                return made
        out = func(*args, **kwargs)
        if fake and name not in REAL_OUTPUT:
            self.add(out)
        return out

    def _check(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
               fake: list[Tensor], blind: Blind) -> None:  # fmt: skip
        raw = getattr(func, "__name__", "")
        writes = "out" in kwargs or raw in _IN_PLACE or (
            raw.endswith("_") and not raw.startswith("_")
        )  # fmt: skip
        if writes:  # fake values written into a real tensor: its views would not know
            target = kwargs.get("out", args[0] if args else None)
            for t in target if isinstance(target, (tuple, list)) else (target,):
                if isinstance(t, Tensor) and not self.holds(t):
                    self.stop(f"{name} writes fake values into a real tensor")
        if blind == "all":
            return
        if blind == "first":
            first = args[0] if args else kwargs.get("input", kwargs.get("tensors"))
            data = first if isinstance(first, (tuple, list)) else (first,)
            if name in _SHAPE_DONORS:  # the other tensor gives its shape only
                data = (*data, args[1] if len(args) > 1 else kwargs.get("other"))
            if all(any(t is d for d in data) for t in fake):
                return
        self.stop(f"{name} could read fake values")


def autocast() -> bool:
    """Whether autocast is on (ops then compute in another dtype than their inputs')."""
    try:
        return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")
    except TypeError:  # torch before 2.4
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


def skipped(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], least: int = 0) -> Any:
    """Zeros for what `func` would return, when it is a costly op (`least` multiply-adds or
    more) whose arguments are plainly valid (their shapes, dtypes and devices agree); None:
    the op is to be computed."""
    rule = _RULES.get(getattr(func, "__name__", ""))
    if rule is None or "out" in kwargs:
        return None
    try:
        made = rule(_Args(args, kwargs))
    except (TypeError, ValueError, IndexError, RuntimeError):
        return None  # arguments the rule does not read: the op itself says what is wrong
    if made is None:
        return None
    shape, like, work = made
    if work < least:
        return None
    first = like if like is not None else next(t for t in (*args, *kwargs.values())
                                               if isinstance(t, Tensor))  # fmt: skip
    out = _zeros(shape, first, like is not None)
    if func.__name__ != "multi_head_attention_forward":  # the one op of two outputs
        return out
    weights = _mha_weights(_Args(args, kwargs))  # the attention weights, when asked for
    return out, None if weights is None else _zeros(weights, first, False)


@dataclass
class _Args:
    """An op's arguments, read by position or keyword."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def __call__(self, index: int, key: str, default: Any = None) -> Any:
        if len(self.args) > index:
            return self.args[index]
        return self.kwargs.get(key, default)

    def tensors(self, *found: Any) -> list[Tensor]:
        """The tensors given (None skipped), checked to be plain dense tensors (no subclass,
        sparse or nested one) of one floating dtype and device."""
        ts = [t for t in found if t is not None]
        if not all(type(t) in _PLAIN and t.layout == torch.strided for t in ts):
            raise TypeError("not a plain dense tensor")
        dtype, device = ts[0].dtype, ts[0].device
        if not dtype.is_floating_point or any(
            t.dtype != dtype or t.device != device for t in ts
        ):  # fmt: skip
            raise TypeError("dtypes or devices differ")
        return ts


_PLAIN = (Tensor, nn.Parameter)

# (output shape, the tensor whose dim order the output's layout follows (None: contiguous),
# multiply-adds); None: not plainly valid
_Made = tuple[tuple[int, ...], Tensor | None, int] | None


def _zeros(shape: tuple[int, ...], like: Tensor, follow: bool) -> Tensor:
    """Zeros of `shape` on `like`'s device and dtype; laid out in `like`'s dim order when
    `follow` (dims of equal stride kept in order), else contiguous."""
    order = list(range(len(shape)))
    if follow:
        given = like.stride()
        order.sort(key=lambda d: -given[d])
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(shape[d], 1)
    return torch.empty_strided(shape, strides, dtype=like.dtype, device=like.device).zero_()


def _linear(a: _Args) -> _Made:
    x, w, b = a(0, "input"), a(1, "weight"), a(2, "bias")
    a.tensors(x, w, b)
    if w.dim() != 2 or x.dim() < 1 or x.shape[-1] != w.shape[1]:
        return None
    if b is not None and tuple(b.shape) != (w.shape[0],):
        return None
    shape = (*x.shape[:-1], w.shape[0])
    return shape, None, math.prod(shape) * w.shape[1]


def _conv(a: _Args, spatial: int) -> _Made:
    x, w = a(0, "input"), a(1, "weight")
    b = a(2, "bias")
    a.tensors(x, w, b)
    groups = a(6, "groups", 1)
    if x.dim() != spatial + 2 or w.dim() != spatial + 2 or not isinstance(groups, int):
        return None
    if groups < 1 or x.shape[1] != w.shape[1] * groups or w.shape[0] % groups:
        return None
    if b is not None and tuple(b.shape) != (w.shape[0],):
        return None
    stride, dilation = _ints(a(3, "stride", 1), spatial), _ints(a(5, "dilation", 1), spatial)
    padding = a(4, "padding", 0)
    if padding == "same" and all(s == 1 for s in stride):
        pads = None
    elif padding == "valid":
        pads = [0] * spatial
    else:
        pads = _ints(padding, spatial)
    sizes = []
    for d in range(spatial):
        size, k = x.shape[2 + d], w.shape[2 + d]
        if pads is not None:
            size = (size + 2 * pads[d] - dilation[d] * (k - 1) - 1) // stride[d] + 1
        if size < 1 or stride[d] < 1 or dilation[d] < 1 or (pads and pads[d] < 0):
            return None
        sizes.append(size)
    shape = (x.shape[0], w.shape[0], *sizes)
    if not w.is_contiguous():  # a channels-last weight can make the output channels-last
        return None
    if x.is_contiguous():
        like = None
    elif spatial == 2 and x.is_contiguous(memory_format=torch.channels_last):
        like = x
    else:
        return None
    return shape, like, math.prod(shape) * math.prod(w.shape[1:])


def _ints(value: Any, count: int) -> list[int]:
    if isinstance(value, int):
        return [value] * count
    if isinstance(value, Sequence) and len(value) == count and all(
        isinstance(v, int) for v in value
    ):  # fmt: skip
        return list(value)
    raise TypeError("not ints")


def _product(a: Tensor, b: Tensor, batched: bool) -> tuple[int, ...] | None:
    """The shape of ``a @ b`` (both at least 2-D; `batched`: batch dims broadcast)."""
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-2]:
        return None
    batch = _broadcast(a.shape[:-2], b.shape[:-2]) if batched else tuple(a.shape[:-2])
    if batch is None or (not batched and a.shape[:-2] != b.shape[:-2]):
        return None
    return (*batch, a.shape[-2], b.shape[-1])


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """The shape `a` and `b` broadcast to (None: they do not)."""
    a, b = (1,) * (len(b) - len(a)) + tuple(a), (1,) * (len(a) - len(b)) + tuple(b)
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b, strict=True)):
        return None
    return tuple(max(x, y) if 1 in (x, y) else x for x, y in zip(a, b, strict=True))


def _matmul(a: _Args) -> _Made:
    x, y = a.tensors(a(0, "input"), a(1, "other"))
    shape = _product(x, y, True)
    return None if shape is None else (shape, None, math.prod(shape) * x.shape[-1])


def _mm(a: _Args, dims: int) -> _Made:
    x, y = a.tensors(a(0, "input"), a(1, "mat2"))
    if x.dim() != dims or y.dim() != dims:
        return None
    shape = _product(x, y, False)
    return None if shape is None else (shape, None, math.prod(shape) * x.shape[-1])


def _add_product(a: _Args, dims: int) -> _Made:
    """addmm / baddbmm: ``input + x @ y``, `input` broadcast to the product."""
    base, x, y = a.tensors(a(0, "input"), a(1, "mat1" if dims == 2 else "batch1"),
                           a(2, "mat2" if dims == 2 else "batch2"))  # fmt: skip
    if x.dim() != dims or y.dim() != dims:
        return None
    shape = _product(x, y, False)
    if shape is None or _broadcast(base.shape, shape) != shape:
        return None
    return shape, None, math.prod(shape) * x.shape[-1]


def _attention(a: _Args) -> _Made:
    q, k, v = a.tensors(a(0, "query"), a(1, "key"), a(2, "value"))
    mask, gqa = a(3, "attn_mask"), a(7, "enable_gqa", False)
    if gqa or q.dim() < 3 or not q.dim() == k.dim() == v.dim():
        return None
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        return None
    scores = (*q.shape[:-1], k.shape[-2])
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.device != q.device:
            return None
        if mask.dtype not in (torch.bool, q.dtype):
            return None
        if _broadcast(mask.shape, scores) != scores:
            return None
    shape = (*q.shape[:-1], v.shape[-1])
    return shape, q, 2 * math.prod(scores) * q.shape[-1]


def _mha(a: _Args) -> _Made:
    """torch's multi-head attention (packed in-projection): its output."""
    q, k, v = a.tensors(a(0, "query"), a(1, "key"), a(2, "value"))
    embed, heads = a(3, "embed_dim_to_check"), a(4, "num_heads")
    w_in, b_in = a(5, "in_proj_weight"), a(6, "in_proj_bias")
    w_out, b_out = a(11, "out_proj_weight"), a(12, "out_proj_bias")
    a.tensors(q, w_in, b_in, w_out, b_out)
    extra = (a(7, "bias_k"), a(8, "bias_v"), a(21, "static_k"), a(22, "static_v"))
    if any(e is not None for e in extra) or a(9, "add_zero_attn"):
        return None
    if a(17, "use_separate_proj_weight", False) or q.dim() != 3 or k.shape != v.shape:
        return None
    length, batch, width = q.shape
    if k.dim() != 3 or k.shape[1:] != (batch, width) or width != embed or width % heads:
        return None
    if w_in is None or tuple(w_in.shape) != (3 * width, width) or w_out.dim() != 2:
        return None
    if (b_in is not None and tuple(b_in.shape) != (3 * width,)) or w_out.shape[1] != width:
        return None
    if b_out is not None and tuple(b_out.shape) != (w_out.shape[0],):
        return None
    if a(24, "is_causal", False) and a(16, "attn_mask") is None:
        return None
    masks = ((a(16, "attn_mask"), (length, k.shape[0])), (a(14, "key_padding_mask"),
             (batch, k.shape[0])))  # fmt: skip
    for mask, tail in masks:
        if mask is not None and (not isinstance(mask, Tensor) or mask.shape[-2:] != tail):
            return None
    return (length, batch, w_out.shape[0]), None, 4 * length * batch * width * width


_RULES: dict[str, Callable[[_Args], _Made]] = {
    "linear": _linear,
    "conv1d": lambda a: _conv(a, 1),
    "conv2d": lambda a: _conv(a, 2),
    "conv3d": lambda a: _conv(a, 3),
    "matmul": _matmul,
    "__matmul__": _matmul,
    "mm": lambda a: _mm(a, 2),
    "bmm": lambda a: _mm(a, 3),
    "addmm": lambda a: _add_product(a, 2),
    "baddbmm": lambda a: _add_product(a, 3),
    "scaled_dot_product_attention": _attention,
    "multi_head_attention_forward": _mha,
}


def _mha_weights(a: _Args) -> tuple[int, ...] | None:
    """The shape of the attention weights multi-head attention returns (None: not asked for):
    averaged over the heads or not."""
    if not a(15, "need_weights", True):
        return None
    length, batch, _ = a(0, "query").shape
    pairs = (batch, length, a(1, "key").shape[0])
    return pairs if a(23, "average_attn_weights", True) else (batch, a(4, "num_heads"), *pairs[1:])
