"""Tracing one forward pass into channel labels: which channel of which layer each value carries.

The forward runs for real under a ``TorchFunctionMode``, so every torch function and tensor method
is seen with its exact arguments (cat dims, split sizes, view shapes) and Python control flow is
simply executed. Each traced tensor carries a label tensor of its own shape: entry = the id of the
output channel it belongs to (-1: none). Ops merge ids that must be pruned together (a residual
add merges the channels it adds), block ids that cannot be removed exactly (and say why), and
record slices: which positions of which parameter or buffer belong to which id.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from prunekit.calibrate.batches import runs_op
from prunekit.core.checks import is_attention_out_proj
from prunekit.structure.trace.labels import along, channel_ids, core, varying
from prunekit.structure.trace.skim import REAL_OUTPUT, Blind, Fakes, autocast

# A handler gets the tracer and the call (its output included); it sets the output's labels.
Handler = Callable[["Tracer", "Call"], None]

# Ops whose output is no tensor or only metadata; never a use of the channels.
METADATA = {"size", "dim", "numel", "__get__", "_assert", "__len__", "is_floating_point"}
_NO_FAKES = METADATA - {"__get__", "_assert"}  # ops that read no value and give no tensor
_PARAM_ELEMENTS_LIMIT = 1 << 20  # a parameter used outside a layer gets one id per element
STRICT_SKIM = False
"""Whether a skimmed trace that fails by anything but `NeedValues`, where the trace computing
every op then succeeds, raises AssertionError (chained to the first failure) instead of
passing unseen: such a failure is a bug of ``trace.skim`` (a wrong shape made for a skipped
op, say), which would else only make the trace slower. The test suite turns it on."""
# True while a forward runs under the tracer (hooks that only fix values stand aside then)
TRACING: contextvars.ContextVar[bool] = contextvars.ContextVar("prunekit_tracing", default=False)


@dataclass(frozen=True)
class ModuleHandler:
    """Traces a whole module at once (its inner ops run untraced): attention, RMSNorm.

    `match(module, tracer)` says whether it applies; `trace(tracer, module, args, kwargs,
    out)` then records the module's slices and sets the labels of its outputs. `blind`: the
    module's output shape and `trace` depend on no value of its inputs (the graph's own
    handlers of attention and RMSNorm), so they may be fake (see ``trace.skim``).
    """

    name: str
    match: Callable[[nn.Module], bool]
    trace: Callable[[Tracer, nn.Module, tuple[Any, ...], dict[str, Any], Any], None]
    blind: bool = False


@dataclass
class Handlers:
    """What the tracer dispatches to (the graph's tables: ``structure.graph.tables``).

    `ops`: the handler of each (normalized) op name, the graph's own and the ones users
    registered. `own`: the graph's own op handlers, each with the operands whose values
    neither it nor the op's output shape depend on, which may be fake while tracing (see
    ``trace.skim``): 'all', 'first' (the first argument, a tensor or a list of them: a move
    replays its other tensors, indices) or 'none'; a handler in `ops` that is not its op's
    own is taken to read every value. `modules`: the module handlers, the first that matches
    a module traces it.
    """

    ops: dict[str, Handler] = field(default_factory=dict)
    own: dict[str, tuple[Handler, Blind]] = field(default_factory=dict)
    modules: list[ModuleHandler] = field(default_factory=list)


def op_name(func: Any) -> str:
    """``torch.cat``, ``Tensor.cat`` and ``Tensor.cat_`` -> 'cat'; dunders are kept."""
    name = getattr(func, "__name__", None) or type(func).__name__
    if name.startswith("__") and name.endswith("__"):
        return name
    if name.endswith("_") and not name.startswith("_"):
        name = name[:-1]
    if name == "fn" and "max_pool" in repr(func):  # F.max_pool*d is a boolean dispatch
        name = getattr(func, "__qualname__", name)
    return name


@dataclass
class Record:
    """Positions along `dim` of tensor `name` of `module` that belong to the channel ids."""

    module_name: str
    module: nn.Module
    name: str
    dim: int
    role: str  # out (makes the channel), in (reads it), bias, norm, buffer, element
    positions: Tensor
    ids: Tensor
    channels: Tensor | None = None  # role 'in': the input channel each position reads
    op: str = ""


@dataclass
class Call:
    """One traced op: its name, arguments, output and where it ran."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any
    where: str

    def arg(self, index: int, key: str, default: Any = None) -> Any:
        if len(self.args) > index:
            return self.args[index]
        return self.kwargs.get(key, default)


@dataclass
class Tracer:
    """The labels, the union-find over channel ids, blocked ids and recorded slices."""

    owners: dict[int, tuple[str, nn.Module, str, bool]] = field(default_factory=dict)
    blocked: list[tuple[Tensor, str]] = field(default_factory=list)  # (ids, why), in order
    records: list[Record] = field(default_factory=list)
    unclaimed: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    elements: dict[int, tuple[int, Tensor]] = field(default_factory=dict)
    where: list[str] = field(default_factory=list)
    claimed: set[int] = field(default_factory=set)
    options: dict[str, Any] = field(default_factory=dict)
    handlers: Handlers = field(default_factory=Handlers)  # what each op and module goes to
    names: dict[int, str] = field(default_factory=dict)  # id of each module -> its name
    suspended: int = 0  # > 0: inside a module a ModuleHandler traces as a whole
    heads: set[int] = field(default_factory=set)  # ids of attention heads (kind 'heads')
    normed: set[int] = field(default_factory=set)  # ids normalized together (kind 'hidden')
    experts: set[int] = field(default_factory=set)  # ids of routed experts (kind 'experts')
    routes: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)  # id of a router's
    # expert indices -> (those indices, the ids of its experts)
    blocks: list[list[int]] = field(default_factory=list)  # ids that lose equal counts
    outputs: list[tuple[int, int, Tensor]] = field(default_factory=list)  # leaf, dim, ids
    fakes: Fakes | None = None  # the fake values, when costly ops are skipped
    _labels: dict[int, tuple[weakref.ref[Tensor], Tensor]] = field(default_factory=dict)
    _positions: dict[tuple[int, str, int], Tensor] = field(default_factory=dict)
    # per tensor and dim: the positions a record gave no id (they read values of no channel)
    _unowned: dict[tuple[int, str, int], Tensor] = field(default_factory=dict)
    # the records of each tensor's positions while no two share one: (positions, ids, their
    # lowest and highest position, once a second record needs them)
    _apart: dict[tuple[int, str, int], list[_Span]] = field(default_factory=dict)
    # labels made from one id per channel (by `along`): id -> (the labels, the ids, their dim)
    _flat: dict[int, tuple[Tensor, Tensor, int]] = field(default_factory=dict)
    _ranges: dict[int, Tensor] = field(default_factory=dict)  # n -> arange(n), never written
    # the union-find: _parent[:_count] are the parents of the ids made so far
    _parent: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    _count: int = 0

    # ids and union-find
    @property
    def parent(self) -> list[int]:
        """Each id's parent in the union-find (an id pointing at itself is a root)."""
        return self.parents().tolist()

    def parents(self) -> Tensor:
        """The parents as a tensor (a view: valid until the next merge or new ids)."""
        return self._parent[: self._count]

    @property
    def made(self) -> int:
        """How many ids were made so far (the next new id)."""
        return self._count

    def new_ids(self, count: int) -> Tensor:
        start = self._count
        if start + count > len(self._parent):  # room for twice as many
            grown = torch.empty(max(2 * (start + count), 1024), dtype=torch.long)
            grown[:start] = self._parent[:start]
            self._parent = grown
        ids = torch.arange(start, start + count)
        self._parent[start : start + count] = ids
        self._count = start + count
        return ids

    def find(self, i: int) -> int:
        return int(self.roots(torch.tensor([i]))[0])

    def roots(self, ids: Tensor) -> Tensor:
        """The root of each id (all >= 0), with the paths on the way compressed."""
        parent = self._parent
        up = parent[ids]
        while True:
            upper = parent[up]
            if torch.equal(upper, up):
                break
            up = upper
        if len(ids):
            parent[ids] = up
        return up

    def merge(self, a: Tensor, b: Tensor) -> None:
        """Merge ids a[k] with b[k] wherever both are >= 0 (a root is its set's smallest id)."""
        if a.shape == b.shape:  # dims along which neither changes need one slice only
            for d in range(a.dim()):  # those both are broadcast along first: the others'
                if a.shape[d] > 1 and a.stride(d) == 0 and b.stride(d) == 0:  # checks then
                    a, b = a.narrow(d, 0, 1), b.narrow(d, 0, 1)  # read one slice of them
            for d in range(a.dim()):
                if a.shape[d] > 1 and _constant(a, d) and _constant(b, d):
                    a, b = a.narrow(d, 0, 1), b.narrow(d, 0, 1)
        a, b = a.reshape(-1), b.reshape(-1)
        both = (a >= 0) & (b >= 0) & (a != b)
        if not bool(both.any()):
            return
        n = self._count
        codes = torch.unique(a[both] * n + b[both])  # unique pairs, as one number each
        self._join(codes // n, codes % n)

    def union(self, a: Tensor, b: Tensor) -> None:
        """Merge a[k] with b[k] wherever both are >= 0, for two vectors of ids (one per
        channel: few pairs, hardly any twice, so taken as they are)."""
        both = torch.minimum(a, b) >= 0
        if not bool(both.all()):
            a, b = a[both], b[both]
            if not len(a):
                return
        self._join(a, b)

    def _join(self, xs: Tensor, ys: Tensor) -> None:
        """Merge xs[k] with ys[k] (all >= 0)."""
        parent = self._parent
        rx, ry = self.roots(xs), self.roots(ys)
        while not torch.equal(rx, ry):
            low = torch.minimum(rx, ry)  # each root of a pair points at the smaller one
            parent.scatter_reduce_(0, rx, low, "amin")
            parent.scatter_reduce_(0, ry, low, "amin")
            rx, ry = self.roots(rx), self.roots(ry)

    def attach(self, fresh: Tensor, other: Tensor) -> None:
        """Merge fresh[k] with other[k] wherever both are >= 0 (one shape), when the `fresh`
        ids are each there once and were made after every id of `other` (a parameter's
        element ids, made for the op that reads it): each joins its partner's set, whose
        root is smaller."""
        fresh, other = fresh.reshape(-1), other.reshape(-1)
        both = torch.minimum(fresh, other) >= 0
        if not bool(both.all()):
            fresh, other = fresh[both], other[both]
        if len(fresh):
            self._parent[fresh] = self.roots(other)

    def block(self, ids: Tensor | None, reason: str) -> None:
        """Leave these ids (and all merged with them) alone, for `reason`."""
        if ids is None:
            return
        found = self.distinct(ids)
        if len(found):
            self.blocked.append((found, reason))

    def distinct(self, ids: Tensor) -> Tensor:
        """The distinct ids (>= 0) among `ids`, sorted: each id marked in a table of all ids
        when there are many entries (no sort of a tensor as large as the activations)."""
        flat = core(ids).reshape(-1)
        if 16 * len(flat) > self._count:
            seen = torch.zeros(self._count + 1, dtype=torch.bool)
            seen[flat.clamp_min(-1) + 1] = True
            return seen[1:].nonzero().flatten()
        found: Tensor = torch.unique(flat[flat >= 0])
        return found

    def varying(self, labels: Tensor) -> list[int]:
        """The dims along which the labels' channels change (ids merged so far counted as
        one: a class token concatenated to the patches is their channel)."""
        dims = varying(labels)
        return dims if len(dims) <= 1 else varying(self.canonical(core(labels)))

    def canonical(self, labels: Tensor) -> Tensor:
        """Labels with every id replaced by its root (ids merged so far look the same)."""
        parent = self._parent
        up = parent[labels.clamp_min(0)]  # followed up to the roots (no sort of the labels)
        while True:
            upper = parent[up]
            if torch.equal(upper, up):
                break
            up = upper
        return torch.where(labels >= 0, up, -1)

    def settled(self, labels: Tensor) -> Tensor:
        """The labels with their ids made roots and broadcast along the dims where the roots
        no longer change (the same labels unless such a dim is found): a ViT's tokens, each
        position's ids merged by the position embedding, carry one id per channel again."""
        found = core(labels)
        if sum(size > 1 for size in found.shape) < 2:
            return labels
        roots = self.canonical(found)
        narrowed = roots
        for d in range(roots.dim()):
            if roots.shape[d] > 1 and _constant(roots, d):
                narrowed = narrowed.narrow(d, 0, 1)
        return labels if narrowed is roots else narrowed.expand(labels.shape)

    def along(self, ids: Tensor, dim: int, shape: torch.Size | tuple[int, ...]) -> Tensor:
        """Ids (one per position of `dim`) broadcast to `shape`, remembered: a layer reading
        these labels along `dim` gets the very same ids tensor back (`flat`), so records of
        the same ids and positions share their entries in the groups."""
        labels = along(ids, dim, shape)
        self._flat[id(labels)] = (labels, ids, dim)  # the labels kept: their id stays theirs
        return labels

    def flat(self, labels: Tensor, dim: int) -> Tensor | None:
        """The ids `along` made `labels` from, when it did so along `dim`."""
        found = self._flat.get(id(labels))
        if found is None or found[0] is not labels or found[2] != dim:
            return None
        return found[1]

    def positions(self, count: int) -> Tensor:
        """``arange(count)``, one tensor per count (records never write their positions)."""
        found = self._ranges.get(count)
        if found is None:
            found = self._ranges[count] = torch.arange(count)
        return found

    # labels of tensors
    def label(self, t: Any) -> Tensor | None:
        if not isinstance(t, Tensor):
            return None
        entry = self._labels.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        return entry[1]

    def set(self, t: Any, labels: Tensor | None, held: bool = False) -> None:
        """Give `t` these labels (None, or no id in them: `t` carries no channels). `held`:
        the labels are known to hold an id (an input's labels, new ids), so not searched."""
        if not isinstance(t, Tensor):
            return
        key = id(t)
        if labels is None or not labels.numel() or (not held and int(core(labels).max()) < 0):
            self._labels.pop(key, None)
            return
        if tuple(labels.shape) != tuple(t.shape):
            raise AssertionError(f"labels of shape {tuple(labels.shape)} for {tuple(t.shape)}")
        labels_of = self._labels

        def forget(_: object, key: int = key) -> None:
            labels_of.pop(key, None)

        self._labels[key] = (weakref.ref(t, forget), labels)

    def owner(self, t: Any) -> tuple[str, nn.Module, str, bool] | None:
        """(module name, module, tensor name, is buffer) of a model parameter or buffer."""
        if not isinstance(t, Tensor):
            return None
        return self.owners.get(id(t))

    def param_labels(self, t: Tensor) -> Tensor | None:
        """Labels for a model tensor used outside a layer: one new id per element."""
        found = self.owner(t)
        if found is None or t.numel() > _PARAM_ELEMENTS_LIMIT:
            return None
        entry = self.elements.get(id(t))
        if entry is None:
            ids = self.new_ids(t.numel()).reshape(t.shape)
            self.elements[id(t)] = entry = (len(self.records), ids)
            mname, module, name, _ = found
            flat = torch.arange(t.numel())
            self.records.append(Record(mname, module, name, -1, "element", flat, ids.reshape(-1)))
        return entry[1]

    def labels_of(self, t: Any) -> Tensor | None:
        """A tensor's labels; a model tensor gets element ids (and counts as claimed)."""
        found = self.label(t)
        if found is None and isinstance(t, Tensor) and self.owner(t) is not None:
            found = self.param_labels(t)
            if found is not None:
                self.claimed.add(id(t))
        return found

    def claim(self, *tensors: Any) -> tuple[str, nn.Module, str, bool] | None:
        """Mark model tensors as used by the handler; return the first one's owner."""
        first = None
        for t in tensors:
            found = self.owner(t)
            if found is not None:
                self.claimed.add(id(t))
                first = first or found
        return first

    def record(self, owner: tuple[str, nn.Module, str, bool] | None, dim: int, role: str,
               positions: Tensor, ids: Tensor, channels: Tensor | None = None,
               op: str = "") -> None:  # fmt: skip
        if owner is None:
            return
        mname, module, name, is_buffer = owner
        role = "buffer" if is_buffer else role
        self.records.append(Record(mname, module, name, dim, role, positions, ids, channels, op))
        if dim >= 0 and len(positions):
            self._same_positions((id(module), name, dim), positions, ids)

    def _same_positions(self, key: tuple[int, str, int], positions: Tensor, ids: Tensor) -> None:
        """Ids that own the same positions of one tensor go together: a weight tied to
        another layer's (an LM head and its embedding), a layer called on two inputs. Records
        of positions apart from each other (a fused projection's query, key and value rows)
        tie nothing: kept as they are until two of them overlap."""
        if key in self._positions:
            self._table(key, positions, ids)
            return
        apart = self._apart.get(key)
        if apart is None:  # nothing to tie yet
            self._apart[key] = [_Span(positions, ids)]
            return
        span = _Span(positions, ids).bounded()
        if all(span.apart(other.bounded()) for other in apart):
            apart.append(span)
            return
        del self._apart[key]
        for other in (*apart, span):
            self._table(key, other.positions, other.ids)

    def _table(self, key: tuple[int, str, int], positions: Tensor, ids: Tensor) -> None:
        size = int(positions.max()) + 1
        seen = self._positions.get(key)
        unowned = self._unowned.get(key)
        if seen is None or unowned is None or len(seen) < size:
            grown = torch.full((size,), -1, dtype=torch.long)
            none = torch.zeros(size, dtype=torch.bool)
            if seen is not None and unowned is not None:
                grown[: len(seen)] = seen
                none[: len(unowned)] = unowned
            seen = self._positions[key] = grown
            unowned = self._unowned[key] = none
        before = seen[positions]
        self.merge(before, ids)
        # an entry one use reads as a channel and another as values of no channel (a layer
        # run on the model's input and on channels, a Parameter of two layers): removing the
        # channel would change the other use, so its channels stay
        free = ids < 0
        clash = torch.cat([ids[~free & unowned[positions]], before[free & (before >= 0)]])
        if len(clash):
            module = self.names.get(key[0], "")
            name = f"{module}.{key[1]}" if module else key[1]
            self.block(clash, f"{name} [dim {key[2]}] is also used on values of no channel "
                              "(the model's input, or values no layer made)")  # fmt: skip
        fresh = before < 0
        seen[positions[fresh]] = ids[fresh]
        unowned[positions[free]] = True


@dataclass
class _Span:
    """One record's positions of a tensor and their ids; `low`/`high`: the lowest and highest
    position (-1 until asked for)."""

    positions: Tensor
    ids: Tensor
    low: int = -1
    high: int = -1

    def bounded(self) -> _Span:
        if self.low < 0 and len(self.positions):
            self.low, self.high = int(self.positions.min()), int(self.positions.max())
        return self

    def apart(self, other: _Span) -> bool:
        """No position in common with `other` (its bounds known; no positions: apart)."""
        if self.low < 0 or other.low < 0:
            return True
        return self.high < other.low or other.high < self.low


def _constant(t: Tensor, dim: int) -> bool:
    return t.stride(dim) == 0 or bool((t == t.narrow(dim, 0, 1)).all())


def compressed(parent: Tensor) -> Tensor:
    """Every id pointing straight at its root (pointers only ever go to smaller ids)."""
    while True:
        up = parent[parent]
        if torch.equal(up, parent):
            return parent
        parent = up


def tensor_owners(
    model: nn.Module, named: list[tuple[str, nn.Module]] | None = None
) -> dict[int, tuple[str, nn.Module, str, bool]]:
    """id of each parameter, buffer and masked tensor -> (module name, module, name, is buffer).

    A pruned tensor is found as ``module.<name>`` (mask x orig), never as its ``_orig`` or
    ``_mask``, which only the pruning hook reads. `named`: the model's named modules, when
    listed already.
    """
    owners: dict[int, tuple[str, nn.Module, str, bool]] = {}
    for mname, module in model.named_modules() if named is None else named:
        masked = {k[: -len("_mask")] for k in module._buffers if k.endswith("_mask")}
        if not masked:  # most modules: every parameter and buffer as it is
            for pname, p in module._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), (mname, module, pname, False))
            for bname, b in module._buffers.items():
                if b is not None:
                    owners.setdefault(id(b), (mname, module, bname, True))
            continue
        for pname, p in module._parameters.items():
            if p is not None and not (pname.endswith("_orig") and pname[:-5] in masked):
                owners.setdefault(id(p), (mname, module, pname, False))
        for bname, b in module._buffers.items():
            if b is not None and not (bname.endswith("_mask") and bname[:-5] in masked):
                owners.setdefault(id(b), (mname, module, bname, True))
        for name in masked:
            value = module.__dict__.get(name)
            if isinstance(value, Tensor):
                owners.setdefault(id(value), (mname, module, name, False))
    return owners


class _Mode(TorchFunctionMode):
    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:  # fmt: skip
        kwargs = kwargs or {}
        tr = self.tracer
        name = _NAMES.get(func)
        if name is None:
            name = _NAMES[func] = op_name(func)
        fakes, inputs = tr.fakes, None
        if fakes is None or name in _NO_FAKES:
            out = _model_op(func, args, kwargs)
        else:
            inputs = _inputs(args, kwargs)
            out = fakes.run(func, name, args, kwargs, inputs, _blind(name, tr.handlers))
        if name in METADATA or tr.suspended:
            return out
        if inputs is None:
            inputs = _inputs(args, kwargs)
        labels, owners = tr._labels, tr.owners
        if not any(id(t) in labels or id(t) in owners for t in inputs):
            return out  # no channels and no model tensor: nothing for a handler to see
        call = Call(name, tuple(args), dict(kwargs), out, tr.where[-1] if tr.where else "")
        tr.claimed = claimed = set[int]()
        handler = tr.handlers.ops.get(name)
        if handler is not None:
            handler(tr, call)
        else:
            for t in inputs:
                tr.block(tr.label(t), f"{describe_op(call)} is not an op the graph knows")
        unclaimed = [owners[id(t)] for t in inputs if id(t) in owners and id(t) not in claimed]
        if unclaimed and _tensors_in((out,), []):
            for found in unclaimed:
                tr.unclaimed.setdefault((found[0], found[2]), []).append(describe_op(call))
        return out


def _model_op(func: Any, args: Any, kwargs: Any) -> Any:
    """The op the model called, run as it called it: an error here is the model's (on its
    inputs), not the tracer's (see calibrate.batches.is_callers)."""
    return func(*args, **kwargs)


runs_op(_model_op)


# each torch function seen -> its op name
_NAMES: dict[Any, str] = {}


def _blind(name: str, handlers: Handlers) -> Blind:
    """What the op of this name and its handler are blind to (a handler a user registered
    in place of the graph's own: nothing)."""
    found = handlers.own.get(name)
    if found is not None and handlers.ops.get(name) is found[0]:
        return found[1]
    if name in REAL_OUTPUT:  # the shape of the first argument only (not a fill value)
        return "first"
    return "all" if name == "__get__" else "none"


def _inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    """The tensors among an op's arguments, in order."""
    found = _tensors_in(args, [])
    return _tensors_in(tuple(kwargs.values()), found) if kwargs else found


def _tensors_in(values: tuple[Any, ...] | list[Any], found: list[Tensor]) -> list[Tensor]:
    """The tensors among `values` and inside their lists, tuples and dicts, in order."""
    for v in values:
        if isinstance(v, Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            _tensors_in(v, found)
        elif isinstance(v, dict):
            _tensors_in(tuple(v.values()), found)
    return found


def _follow_masks(tracer: Tracer, mname: str, module: nn.Module,
                  parent: nn.Module | None = None) -> list[Any]:  # fmt: skip
    """A pre-hook after the pruning hooks: they make ``module.<name>`` anew at each forward.
    A MultiheadAttention's out_proj is never called, its parent reads its weight: its masked
    weight is made anew when the parent runs (`parent`), so the hook goes on both."""
    names = [k[: -len("_mask")] for k in module._buffers if k.endswith("_mask")]
    names = [n for n in names if n + "_orig" in module._parameters]
    if not names:
        return []

    current = {name: id(module.__dict__.get(name)) for name in names}

    def follow(_: nn.Module, __: Any) -> None:
        for name in names:
            value = module.__dict__.get(name)
            if isinstance(value, Tensor) and id(value) != current[name]:
                tracer.owners.pop(current[name], None)  # that id may now be anything else
                current[name] = id(value)
                tracer.owners[id(value)] = (mname, module, name, False)

    holders = [module] if parent is None else [module, parent]
    return [holder.register_forward_pre_hook(follow) for holder in holders]


def describe_op(call: Call) -> str:
    return f"{call.name} (in {call.where or 'the model'})"


def run_traced(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], handlers: Handlers,
    options: dict[str, Any] | None = None, skim: bool = True,
) -> tuple[Tracer, Any]:  # fmt: skip
    """Run `model` once under the tracer (eval mode, no grad); return the tracer and outputs.

    `handlers`: what each op and module goes to (``structure.graph.tables.HANDLERS``).

    `skim`: the costly ops are first skipped (``trace.skim``; not under autocast): the outputs
    are then fake, and when an op could read fake values (or they made the forward fail), the
    model runs again computing every op; the tracer is the same either way (`STRICT_SKIM`:
    a failure of the skimmed run other than `NeedValues` raises AssertionError then).
    """
    failed: Exception | None = None  # the skimmed run's error, when not NeedValues's
    if skim and not autocast():
        fakes = Fakes()
        try:
            tracer, out = _run_traced(model, args, kwargs, handlers, options, fakes)
        except Exception as error:  # NeedValues, or values the model needs were fake
            # an error after NeedValues (which the model may catch, and answer with an error
            # of its own) follows from that signal; any other is the skim's (STRICT_SKIM)
            failed = None if fakes.stopped else error
            fakes.stopped = fakes.stopped or "the forward failed on fake values"
        else:
            if not fakes.stopped:  # no NeedValues, even one the model caught
                return tracer, out
    found = _run_traced(model, args, kwargs, handlers, options, None)
    if failed is not None and STRICT_SKIM:
        raise AssertionError(
            f"the skimmed trace of {type(model).__name__} failed where computing every op "
            f"did not: {type(failed).__name__}: {failed}"
        ) from failed
    return found


def _run_traced(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], handlers: Handlers,
    options: dict[str, Any] | None, fakes: Fakes | None,
) -> tuple[Tracer, Any]:  # fmt: skip
    named = list(model.named_modules())
    owners = tensor_owners(model, named)
    tracer = Tracer(owners=owners, options=dict(options or {}), handlers=handlers)
    tracer.fakes = fakes
    names = tracer.names = {id(m): n for n, m in named}

    def enter(module: nn.Module, _: Any) -> None:
        tracer.where.append(names.get(id(module), type(module).__name__) or type(module).__name__)

    def leave(module: nn.Module, _: Any, __: Any) -> None:
        if tracer.where:
            tracer.where.pop()

    pre = nn.modules.module.register_module_forward_pre_hook(enter)
    post = nn.modules.module.register_module_forward_hook(leave)
    parents = {id(m._modules["out_proj"]): m for _, m in named
               if is_attention_out_proj(m._modules.get("out_proj"))}  # fmt: skip
    handles = [h for name, m in named for h in _follow_masks(tracer, name, m, parents.get(id(m)))]
    handles += _attach_module_handlers(tracer, [m for _, m in named])
    training = [m for _, m in named if m.training]
    token = TRACING.set(True)
    try:
        if training:
            model.eval()
        with torch.no_grad(), _Mode(tracer):
            out = model(*args, **kwargs)
    finally:
        TRACING.reset(token)
        pre.remove()
        post.remove()
        for handle in handles:
            if handle is not None:
                handle.remove()
        for m in training:
            m.training = True
    _outputs(tracer, out)
    return tracer, out


def _attach_module_handlers(tracer: Tracer, modules: list[nn.Module]) -> list[Any]:
    """Hooks that suspend op tracing inside each module a ModuleHandler matches, and hand the
    whole call to it when the module returns."""
    handles: list[Any] = []
    for module in modules:
        for handler in tracer.handlers.modules:
            if handler.match(module):
                break
        else:
            continue

        def before(_: nn.Module, args: Any, kwargs: Any) -> None:
            tracer.suspended += 1

        def after(m: nn.Module, args: Any, kwargs: Any, out: Any,
                  handler: ModuleHandler = handler) -> None:  # fmt: skip
            tracer.suspended -= 1
            fakes = tracer.fakes
            if fakes is not None and not handler.blind:
                held = [t for t in _tensors_in((args, kwargs, out), []) if fakes.holds(t)]
                if held:
                    fakes.stop(f"{handler.name} could read fake values")
            if not tracer.suspended:
                with torch._C.DisableTorchFunction():  # its own ops are no part of the model
                    handler.trace(tracer, m, tuple(args), dict(kwargs), out)

        handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(module.register_forward_hook(after, with_kwargs=True))
    return handles


def _outputs(tracer: Tracer, out: Any) -> None:
    """Channels that reach the model's output: one dim of channels per output is recorded
    (only a group of the hidden width may be pruned there); anything else is blocked."""
    for k, t in enumerate(tree_flatten(out)[0]):
        labels = tracer.label(t)
        if labels is None:
            continue
        dims = tracer.varying(labels)
        if len(dims) != 1:
            tracer.block(labels, "they reach the model's output")
            continue
        ids = channel_ids(tracer, labels, dims[0], t.shape[dims[0]], "the model's output")
        tracer.outputs.append((k, dims[0], ids))
