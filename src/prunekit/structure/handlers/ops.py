"""Handlers of the tensor ops: element-wise, broadcasting binary ops, moves, pools, reductions.

Moves (views, permutes, cat, chunk, indexing) are replayed on the label tensors themselves, so
their labels are exact whatever the shapes; each checks that removing channels commutes with
it (a view that splits the channels, or a slice with fixed bounds through them, does not).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from prunekit.structure.trace.labels import along, core, either, one_dim, positive, varying
from prunekit.structure.trace.tracer import Call, Tracer, describe_op

UNARY = [
    "relu",
    "relu6",
    "leaky_relu",
    "elu",
    "selu",
    "celu",
    "gelu",
    "silu",
    "mish",
    "hardswish",
    "hardsigmoid",
    "hardtanh",
    "sigmoid",
    "tanh",
    "softplus",
    "softsign",
    "logsigmoid",
    "tanhshrink",
    "softshrink",
    "hardshrink",
    "threshold",
    "rrelu",
    "glu_",
    "dropout",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "alpha_dropout",
    "feature_alpha_dropout",
    "abs",
    "neg",
    "exp",
    "clamp",
    "clip",
    "clamp_min",
    "clamp_max",
    "contiguous",
    "clone",
    "detach",
    "float",
    "double",
    "half",
    "bfloat16",
    "to",
    "type_as",
    "square",
    "sqrt",
    "erf",
    "__neg__",
    "__abs__",
    "sin",
    "cos",
    "pow",
    "__pow__",
    "rsqrt",
    "reciprocal",
    "log",
    "log1p",
    "expm1",
]


def unary(tr: Tracer, call: Call) -> None:
    labels = tr.label(call.arg(0, "input"))
    others = [a for a in call.args[1:] + tuple(call.kwargs.values()) if isinstance(a, Tensor)]
    if any(tr.label(a) is not None for a in others):
        for a in (call.arg(0, "input"), *others):
            tr.block(tr.label(a), f"{describe_op(call)} with several tensors is not understood")
        return
    if labels is not None and isinstance(call.out, Tensor) and call.out.shape == labels.shape:
        tr.set(call.out, labels, held=True)


# name -> (kind, operands swapped)
BINARY = {
    "add": ("add", False), "__add__": ("add", False), "__radd__": ("add", True),
    "__iadd__": ("add", False), "sub": ("add", False), "__sub__": ("add", False),
    "__rsub__": ("add", True), "__isub__": ("add", False), "rsub": ("add", False),
    "maximum": ("add", False), "minimum": ("add", False),
    "mul": ("mul", False), "__mul__": ("mul", False), "__rmul__": ("mul", True),
    "__imul__": ("mul", False), "multiply": ("mul", False),
    "div": ("div", False), "true_divide": ("div", False), "__truediv__": ("div", False),
    "__itruediv__": ("div", False), "__rtruediv__": ("div", True), "__div__": ("div", False),
    "divide": ("div", False),
}  # fmt: skip


def binary(tr: Tracer, call: Call) -> None:
    kind, swapped = BINARY[call.name]
    a, b = call.arg(0, "input"), call.arg(1, "other")
    if swapped:
        a, b = b, a
    out = call.out
    if not isinstance(out, Tensor):
        return
    made = tr.made
    la, lb = tr.labels_of(a), tr.labels_of(b)
    if la is None and lb is None:
        return
    full = [None if lab is None else lab.expand(out.shape) for lab in (la, lb)]
    if kind != "div" and _channelwise(tr, full, out):
        return
    where = describe_op(call)
    shapes = [tuple(lab.shape) if lab is not None else () for lab in (la, lb)]
    for k in (0, 1):  # one value per position spread over the other's channels (a gate)
        if full[k] is not None and full[1 - k] is not None and _spread(tr, shapes, full, k, out):
            tr.block(full[k], f"{where} spreads one value of theirs over many channels")
            full[k] = None
    if kind == "div" and full[1] is not None:
        tr.block(full[1], f"{where} divides by them")
        full[1] = None
    for mine, other, theirs in ((full[0], b, full[1]), (full[1], a, full[0])):
        if mine is None or theirs is not None:
            continue
        if _sliced_against(mine, other, out):
            tr.block(mine, f"{where} combines them with a tensor of the model's code")
        elif kind == "add" and isinstance(other, Tensor) and other.numel() > 1:
            tr.block(mine, f"{where} adds values of no channel to them")
    first, second = full
    if first is not None and second is not None:
        fresh = [_fresh(lab, made, out) for lab in (la, lb)]
        if fresh[0] or fresh[1]:  # a parameter's element ids, made just now: no union-find
            tr.attach(*((first, second) if fresh[0] else (second, first)))
        else:
            tr.merge(first, second)
        tr.set(out, tr.settled(either(first, second)))
    else:
        tr.set(out, first if first is not None else second)


def _channelwise(tr: Tracer, full: list[Tensor | None], out: Tensor) -> bool:
    """Both operands' labels (broadcast to the output) stored along one and the same dim, one
    id per channel (a residual add, a per-channel scale): the channels merged pairwise and the
    output given the first's ids, else the second's, along that dim. False (nothing done)
    for any other labels."""
    first, second = full
    if first is None or second is None:
        return False
    dim = one_dim(first)
    if dim is None or one_dim(second) != dim:
        return False
    a, b = core(first).reshape(-1), core(second).reshape(-1)
    tr.union(a, b)
    tr.set(out, along(torch.where(a >= 0, a, b), dim, out.shape))
    return True


def _fresh(labels: Tensor | None, made: int, out: Tensor) -> bool:
    """Whether `labels` are element ids made for this op (a parameter the graph saw first
    here: each id is a set of its own, newer than any other), one per output value."""
    return (labels is not None and labels.numel() == out.numel()
            and int(labels.reshape(-1)[0]) >= made)  # fmt: skip


def _spread(tr: Tracer, shapes: list[tuple[int, ...]], full: list[Tensor | None], k: int,
            out: Tensor) -> bool:  # fmt: skip
    """Whether operand k (of `shapes[k]`) is broadcast along a dim where the other's
    channels vary: merging them would tie its one unit to all of those channels."""
    theirs = full[1 - k]
    assert theirs is not None
    shape = (1,) * (out.dim() - len(shapes[k])) + shapes[k]
    spread = {d for d in range(out.dim()) if shape[d] == 1 and out.shape[d] > 1}
    return bool(spread & set(tr.varying(theirs)))


def _sliced_against(labels: Tensor, other: Any, out: Tensor) -> bool:
    """Whether `other` (no model tensor) lines up with the channels: it would need slicing."""
    if not isinstance(other, Tensor) or other.numel() <= 1:
        return False
    shape = (1,) * (out.dim() - other.dim()) + tuple(other.shape)
    return any(shape[d] > 1 for d in varying(labels))


MOVES = [
    "permute",
    "transpose",
    "swapaxes",
    "swapdims",
    "t",
    "movedim",
    "moveaxis",
    "unsqueeze",
    "squeeze",
    "expand",
    "expand_as",
    "repeat",
    "flatten",
    "unflatten",
    "view",
    "reshape",
    "view_as",
    "reshape_as",
    "cat",
    "concat",
    "concatenate",
    "stack",
    "__getitem__",
    "chunk",
    "split",
    "unbind",
    "narrow",
    "select",
    "tensor_split",
    "flip",
    "roll",
    "pixel_shuffle",
    "pixel_unshuffle",
    "index_select",
    "hstack",
    "vstack",
]


def move(tr: Tracer, call: Call) -> None:
    data = _data(call)
    found = [(t, tr.labels_of(t)) for t in data]
    if all(lab is None for _, lab in found):
        return
    if call.name in _CATS and _cat_channels(tr, call, [lab for _, lab in found]):
        return
    swap = {id(t): lab if lab is not None else _none(t) for t, lab in found}
    args = (_substitute(call.args[0], swap), *call.args[1:])
    kwargs = {k: _substitute(v, swap) if k in ("input", "tensors") else v
              for k, v in call.kwargs.items()}  # fmt: skip
    name = {"view": "reshape", "view_as": "reshape_as"}.get(call.name, call.name)
    replay = getattr(torch.Tensor, name) if hasattr(torch.Tensor, name) else getattr(torch, name)
    labels = _cat(call, [swap[id(t)] for t in data]) if name in _CATS else None
    if name == "roll":
        labels = _rolled_broadcast(call, swap[id(data[0])])
    if labels is None:
        labels = replay(*args, **kwargs)
    outs = call.out if isinstance(call.out, (tuple, list)) else (call.out,)
    labs = labels if isinstance(labels, (tuple, list)) else (labels,)
    problem = _does_not_commute(tr, call, found, labs[0])
    if problem:
        for _, lab in found:
            tr.block(lab, f"{describe_op(call)} {problem}")
    for t, lab in zip(outs, labs, strict=False):
        if isinstance(t, Tensor):
            tr.set(t, lab if lab.shape == t.shape else None)


_CATS = ("cat", "concat", "concatenate")


def _cat(call: Call, labels: list[Tensor]) -> Tensor | None:
    """The labels of a concatenation, kept broadcast along the dims every part is broadcast
    along (DenseNet's features: one id per channel, not one per value); None: replay it."""
    ndim = labels[0].dim() if labels else 0
    if not ndim or any(lab.dim() != ndim for lab in labels) or len(call.args) > 2:
        return None
    dim = positive(_dim_arg(call, 1), ndim)
    shared = [d for d in range(ndim) if d != dim
              and all(lab.stride(d) == 0 and lab.shape[d] > 1 for lab in labels)]  # fmt: skip
    if not shared:
        return None
    for d in shared:
        labels = [lab.narrow(d, 0, 1) for lab in labels]
    joined = torch.cat(labels, dim)
    shape = list(joined.shape)
    for d in shared:
        shape[d] = call.out.shape[d]
    return joined.expand(shape)


def _cat_channels(tr: Tracer, call: Call, labels: list[Tensor | None]) -> bool:
    """A concatenation of parts that each carry one id per channel along the dim they are
    joined on (DenseNet's features): the output carries their ids joined. False (nothing
    done) for any other parts."""
    if len(call.args) > 2 or not isinstance(call.out, Tensor):
        return False
    dim = positive(_dim_arg(call, 1), call.out.dim())
    parts = []
    for lab in labels:
        if lab is None or lab.dim() != call.out.dim() or one_dim(lab) != dim:
            return False
        parts.append(core(lab).reshape(-1))
    tr.set(call.out, along(torch.cat(parts), dim, call.out.shape))
    return True


def _rolled_broadcast(call: Call, labels: Tensor) -> Tensor | None:
    """The labels themselves when every dim rolled is one they are broadcast along (a
    shifted window's tokens: one id per channel stays so); None: replay the roll."""
    rolled = _roll_dims(call, labels.dim()) if call.arg(2, "dims", None) is not None else None
    if rolled is None or any(labels.stride(d) and labels.shape[d] > 1 for d in rolled):
        return None
    return labels


def _data(call: Call) -> list[Tensor]:
    """The tensors whose values the move carries (never index tensors or shape donors)."""
    first = call.args[0] if call.args else call.kwargs.get("input", call.kwargs.get("tensors"))
    if isinstance(first, Tensor):
        return [first]
    if isinstance(first, (list, tuple)):
        return [t for t in first if isinstance(t, Tensor)]
    return []


def _none(t: Tensor) -> Tensor:
    return torch.full((1,) * t.dim(), -1, dtype=torch.long).expand(t.shape)


def _tensors(call: Call) -> list[Tensor]:
    found: list[Tensor] = []
    for a in (*call.args, *call.kwargs.values()):
        if isinstance(a, Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(t for t in a if isinstance(t, Tensor))
    return found


def _substitute(value: Any, swap: dict[int, Tensor]) -> Any:
    if isinstance(value, Tensor):
        return swap.get(id(value), value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, Tensor) for v in value):
        return type(value)(_substitute(v, swap) for v in value)
    if isinstance(value, dict):
        return {k: _substitute(v, swap) for k, v in value.items()}
    return value


def _dim_arg(call: Call, index: int, default: int = 0) -> int:
    value = call.arg(index, "dim", default)
    return int(value)


def _does_not_commute(
    tr: Tracer, call: Call, found: list[tuple[Tensor, Tensor | None]], after: Tensor
) -> str:
    """Why removing channels would change what this move does ('' if it would not). The dims
    the channels vary along are found only for the moves that read them."""
    x, labels = found[0]
    if labels is None:
        return ""
    name = call.name
    if name == "roll":  # its second argument is the shifts, maybe a tuple
        return "rolls the channels" if _roll_dims(call, x.dim()) & set(tr.varying(labels)) else ""
    if name in ("narrow", "select", "unbind", "index_select", "tensor_split"):
        dim = positive(_dim_arg(call, 1), x.dim())
        taken = dim in tr.varying(labels)
        return f"takes fixed positions of the channels (dim {dim})" if taken else ""
    if name == "split":
        dim = positive(_dim_arg(call, 2), x.dim())
        cut = dim in tr.varying(labels)
        return f"splits the channels at fixed sizes (dim {dim})" if cut else ""
    if name == "chunk":
        return _chunk(tr, call, x, labels, tr.varying(labels))
    if name == "__getitem__":
        return _getitem(call.arg(1, "idx"), x, tr.varying(labels))
    if name in ("view", "reshape", "flatten", "unflatten", "view_as", "reshape_as"):
        return _reshape(x.shape, after.shape, tr.varying(labels), varying(after))
    return ""  # the other moves carry whole channels


def _roll_dims(call: Call, ndim: int) -> set[int]:
    dims = call.arg(2, "dims", None)
    if dims is None:
        return set(range(ndim))
    dims = (dims,) if isinstance(dims, int) else dims
    return {positive(int(d), ndim) for d in dims}


def _chunk(tr: Tracer, call: Call, x: Tensor, labels: Tensor, dims: list[int]) -> str:
    pieces, dim = int(call.arg(1, "chunks")), positive(_dim_arg(call, 2), x.dim())
    if dim not in dims:
        return ""
    size = x.shape[dim]
    if size % pieces:
        return f"cuts {size} channels into {pieces} unequal chunks"
    parts = labels.reshape(*labels.shape[:dim], pieces, size // pieces, *labels.shape[dim + 1 :])
    parts = parts.movedim(dim, 0)
    tr.merge(parts[:1].expand_as(parts), parts)  # the chunks must stay of one size
    return ""


def _getitem(index: Any, x: Tensor, dims: list[int]) -> str:
    items = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in items):
        at = next(k for k, i in enumerate(items) if i is Ellipsis)
        used = sum(1 for i in items if i is not None and i is not Ellipsis)
        items = items[:at] + (slice(None),) * (x.dim() - used) + items[at + 1 :]
    dim = 0
    for item in items:
        if item is None:
            continue
        if dim in dims and not _full(item, x.shape[dim]):
            return f"indexes the channels with fixed positions (dim {dim})"
        if isinstance(item, Tensor) and item.dtype == torch.bool:
            dim += item.dim()
        else:
            dim += 1
    return ""


def _full(item: Any, size: int) -> bool:
    if not isinstance(item, slice):
        return False
    start, stop, step = item.start, item.stop, item.step
    return start in (None, 0) and (stop is None or stop >= size) and step in (None, 1)


def _reshape(before: torch.Size, after: torch.Size, dims: list[int], dims_after: list[int]) -> str:
    """A reshape commutes with removing channels when, in each run of dims it merges or
    splits, the labels vary along at most one dim before and one after (a flatten, or its
    inverse); a split of the channels into several dims (heads, a channel shuffle) does not."""
    i = j = 0
    while i < len(before) or j < len(after):
        run_in, run_out = [i], [j]
        size_in = before[i] if i < len(before) else 1
        size_out = after[j] if j < len(after) else 1
        while size_in != size_out:
            if size_in < size_out:
                i += 1
                run_in.append(i)
                size_in *= before[i] if i < len(before) else 1
            else:
                j += 1
                run_out.append(j)
                size_out *= after[j] if j < len(after) else 1
        i, j = i + 1, j + 1
        if len([d for d in run_in if d in dims]) > 1 or len(
            [d for d in run_out if d in dims_after]
        ) > 1:  # fmt: skip
            return "splits the channels into several dims (as heads or a channel shuffle)"
    return ""


POOLS = [
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "lp_pool1d",
    "lp_pool2d",
    "max_pool1d_with_indices",
    "max_pool2d_with_indices",
    "max_pool3d_with_indices",
    "_max_pool1d",
    "_max_pool2d",
    "_max_pool3d",
    "interpolate",
    "upsample",
    "upsample_nearest",
    "upsample_bilinear",
    "pad",
]


def pool(tr: Tracer, call: Call) -> None:
    x = call.arg(0, "input")
    labels = tr.label(x)
    if labels is None:
        return
    if call.name == "pad":
        spatial = len(call.arg(1, "pad")) // 2
    elif call.name[-2:-1].isdigit():
        spatial = int(call.name[-2])
    else:
        spatial = x.dim() - 2
    first = x.dim() - spatial
    if any(d >= first for d in varying(labels)):
        tr.block(labels, f"{describe_op(call)} moves values across the channels")
        return
    kept = labels[(...,) + (0,) * spatial] if spatial else labels
    outs = call.out if isinstance(call.out, (tuple, list)) else (call.out,)
    for t in outs:
        if isinstance(t, Tensor) and t.dim() == x.dim():
            tr.set(t, kept.reshape(kept.shape + (1,) * spatial).expand(t.shape))


REDUCE = [
    "mean",
    "sum",
    "amax",
    "amin",
    "max",
    "min",
    "std",
    "var",
    "norm",
    "logsumexp",
    "prod",
    "nansum",
    "nanmean",
]


def reduce(tr: Tracer, call: Call) -> None:
    x = call.arg(0, "input")
    labels = tr.label(x)
    if labels is None:
        return
    dim = call.arg(1, "dim", None)
    if isinstance(dim, Tensor) or (call.name in ("max", "min") and dim is None):
        tr.block(labels, f"{describe_op(call)} is not understood with these arguments")
        return
    reduced = set(range(x.dim())) if dim is None else {
        positive(int(d), x.dim()) for d in ((dim,) if isinstance(dim, int) else dim)
    }  # fmt: skip
    if reduced & set(varying(labels)):
        tr.block(labels, f"{describe_op(call)} reduces over them")
        return
    keep = bool(call.arg(2, "keepdim", False))
    index = tuple(slice(0, 1) if d in reduced else slice(None) for d in range(x.dim()))
    kept = labels[index]
    if not keep:
        kept = kept.reshape([s for d, s in enumerate(kept.shape) if d not in reduced])
    outs = call.out if isinstance(call.out, (tuple, list)) else (call.out,)
    for t in outs:
        if isinstance(t, Tensor) and tuple(t.shape) == tuple(kept.shape):
            tr.set(t, kept)


# the ops along one dim (a softmax over the channels' dim blocks them)
ALONG_DIM = ("softmax", "log_softmax", "normalize", "cumsum", "cumprod")


def along_dim(tr: Tracer, call: Call) -> None:
    x = call.arg(0, "input")
    labels = tr.label(x)
    if labels is None:
        return
    index = 2 if call.name == "normalize" else 1
    dim = call.arg(index, "dim", 1 if call.name == "normalize" else None)
    if dim is None or positive(int(dim), x.dim()) in varying(labels):
        tr.block(labels, f"{describe_op(call)} mixes values across them")
        return
    tr.set(call.out, labels)


# the products that contract over a dim (outside an attention module the graph knows)
CONTRACTS = (
    "matmul", "mm", "bmm", "einsum", "baddbmm", "scaled_dot_product_attention",
    "multi_head_attention_forward", "__matmul__", "bilinear",
)  # fmt: skip


def contracts(tr: Tracer, call: Call) -> None:
    for t in _tensors(call):
        tr.block(
            tr.label(t),
            f"{describe_op(call)} contracts over them (outside an attention module the graph "
            "knows: see prunekit.structure.families.attention)",
        )
