"""``channel_groups``: trace one forward pass into groups of coupled channel slices.

A group is a set of units (channels that are removed together) and the slices that each unit
owns: positions along one dim of a parameter or buffer of some module. Removing unit u of a
group means removing, in every slice, the positions ``indices[u]``. A group that cannot be
pruned exactly says why in ``reason``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.structure import attention, experts, layers, mha, norms, ops  # noqa: F401
from prunekit.structure.trace import Record, Tracer, run_traced


@dataclass(frozen=True)
class Slice:
    """Positions along `dim` of ``module.<name>`` owned by each unit of a group.

    `role`: 'out' (the rows that make the channel), 'in' (a consumer's weight that reads it),
    'bias', 'norm' (per-channel parameters), 'buffer' (running statistics), 'depthwise' (a
    depthwise conv's rows), 'element' (a parameter combined with the channels in forward).
    For role 'in', `channels[u]` are the input channels of the op that the positions read.
    """

    module_name: str
    module: nn.Module = field(repr=False, compare=False)
    name: str
    dim: int
    role: str
    indices: tuple[tuple[int, ...], ...] = field(repr=False)
    channels: tuple[tuple[int, ...], ...] | None = field(default=None, repr=False)
    op: str = ""

    @property
    def qualified(self) -> str:
        return f"{self.module_name}.{self.name}" if self.module_name else self.name

    @property
    def is_buffer(self) -> bool:
        return self.role == "buffer"


@dataclass(frozen=True)
class ChannelGroup:
    """Coupled channels: `size` units, each owning its positions in every slice.

    `kind`: 'channels' (a layer's output channels), 'heads' (the heads of one attention
    module: a unit is a head's query/key/value rows and its output projection's columns),
    'hidden' (a width that LayerNorm/RMSNorm normalize over, coupled through the residuals)
    or 'experts' (the routed experts of one mixture-of-experts block: a unit is an expert's
    weights along the expert dim and its router row).
    `blocks`: units that must each lose the same count (the query heads of each key/value
    group). `outputs`: (output index, dim, positions per unit) of the model's outputs that
    carry these channels (a pruned hidden width makes those outputs narrower).
    """

    slices: tuple[Slice, ...]
    size: int
    reason: str | None = None
    kind: str = "channels"
    blocks: tuple[tuple[int, ...], ...] = ()
    outputs: tuple[tuple[int, int, tuple[tuple[int, ...], ...]], ...] = field(
        default=(), repr=False
    )

    @property
    def prunable(self) -> bool:
        return self.reason is None

    @property
    def name(self) -> str:
        """The slices that make the channels, such as 'layer1.0.conv1.weight'."""
        makers = [s.qualified for s in self.slices if s.role == "out"]
        return "+".join(makers[:3]) + ("+..." if len(makers) > 3 else "")

    def __str__(self) -> str:
        state = "prunable" if self.reason is None else f"left alone: {self.reason}"
        parts = ", ".join(f"{s.qualified}[dim {s.dim}]" for s in self.slices)
        unit = {"heads": "heads", "hidden": "hidden channels", "experts": "experts"}.get(
            self.kind, "channels"
        )
        return f"{self.size} {unit} of {self.name} ({state}): {parts}"


GQA_UNITS = ("query", "group")


def channel_groups(model: nn.Module, example_inputs: Any, *, gqa: str = "query") -> list[
    ChannelGroup
]:  # fmt: skip
    """The groups of coupled channels of `model`, traced from one forward on `example_inputs`.

    `example_inputs`: a tensor, a tuple of positional arguments or a dict of keyword
    arguments. The forward runs once in eval mode without gradients (the model's mode is
    restored). Prunable groups come first; the others carry the reason they are left alone.
    `gqa`: the unit of an attention with grouped-query heads: 'query' (query heads, the same
    count from every key/value group) or 'group' (whole key/value groups with their query
    heads).
    """
    check_model(model, "channel_groups")
    check_gqa(gqa, "channel_groups")
    return traced_groups(model, example_inputs, gqa, "channel_groups")


def traced_groups(model: nn.Module, example_inputs: Any, gqa: str, owner: str) -> list[
    ChannelGroup
]:  # fmt: skip
    """The groups, `gqa` unchecked: 'auto' (compact) takes whole key/value groups in the
    attention modules where some are masked whole, query heads elsewhere."""
    args, kwargs = split_inputs(example_inputs, owner)
    tracer, _ = run_traced(model, args, kwargs, {"gqa": gqa})
    return build_groups(tracer)


def check_gqa(gqa: Any, owner: str) -> None:
    if not isinstance(gqa, str) or gqa not in GQA_UNITS:
        raise ValueError(
            f"{owner}: invalid gqa={gqa!r}; expected 'query' (query heads, the same count "
            "from every key/value group) or 'group' (whole key/value groups)"
        )


def check_model(model: Any, owner: str) -> None:
    if not isinstance(model, nn.Module):
        kind = type(model)
        if kind.__module__.split(".")[0] == "tensorplay":
            raise TypeError(
                f"{owner}: model is a TensorPlay module ({kind.__name__}); the channel graph "
                "traces torch ops, which TensorPlay's modules do not run. Expected a "
                "torch.nn.Module"
            )
        raise TypeError(f"{owner}: model={model!r} is no torch.nn.Module")


def split_inputs(example_inputs: Any, owner: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example_inputs, Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, Sequence) and not isinstance(example_inputs, str):
        return tuple(example_inputs), {}
    raise TypeError(
        f"{owner}: example_inputs={type(example_inputs).__name__}; expected a tensor, a tuple "
        "of positional arguments or a dict of keyword arguments"
    )


def build_groups(tr: Tracer) -> list[ChannelGroup]:
    """Resolve the tracer's ids into units and the units into groups."""
    root_of = [tr.find(i) for i in range(len(tr.parent))]  # for lookups one id at a time
    roots = torch.tensor(root_of, dtype=torch.long)
    reasons: dict[int, list[str]] = defaultdict(list)
    for ids, why in tr.blocked:
        for root in torch.unique(roots[ids]).tolist():
            _add(reasons[root], [why])
    records = [r for r in tr.records if r.role != "element"]
    made = [roots[r.ids[r.ids >= 0]] for r in records if r.role == "out"]
    makers = set(torch.unique(torch.cat(made)).tolist()) if made else set()
    for r in tr.records:
        if r.role == "element":
            records.extend(_element_slices(r, roots, makers, reasons))
    for (mname, name), uses in tr.unclaimed.items():
        for r in records:
            if r.module_name == mname and r.name == name:
                why = f"{_qualified(mname, name)} is also used by {uses[0]}"
                for x in _roots(r, roots):
                    _add(reasons[x], [why])
    extra = _Extra(
        heads={root_of[i] for i in tr.heads},
        experts={root_of[i] for i in tr.experts},
        normed={root_of[i] for i in tr.normed},
        block_of={root_of[i]: b for b, ids in enumerate(tr.blocks) for i in ids},
        outputs=tr.outputs,
        roots=root_of,
    )
    for _, _, ids in tr.outputs:
        for x in {root_of[i] for i in ids.tolist() if i >= 0}:
            if x not in extra.normed:
                _add(reasons[x], ["they reach the model's output"])
    return _groups(records, roots, makers, reasons, extra)


@dataclass
class _Extra:
    """What the tracer knows of ids beyond slices: heads, normalized widths, outputs."""

    heads: set[int]
    experts: set[int]
    normed: set[int]
    block_of: dict[int, int]
    outputs: list[tuple[int, int, Tensor]]
    roots: list[int]

    def kind(self, members: list[int]) -> str:
        if any(m in self.heads for m in members):
            return "heads"
        if any(m in self.experts for m in members):
            return "experts"
        return "hidden" if any(m in self.normed for m in members) else "channels"

    def blocks(self, members: list[int]) -> tuple[tuple[int, ...], ...]:
        found: dict[int, list[int]] = defaultdict(list)
        for u, root in enumerate(members):
            if root in self.block_of:
                found[self.block_of[root]].append(u)
        return tuple(tuple(units) for units in found.values())

    def reached(
        self, members: list[int]
    ) -> tuple[tuple[int, int, tuple[tuple[int, ...], ...]], ...]:
        unit = {root: u for u, root in enumerate(members)}
        found = []
        for leaf, dim, ids in self.outputs:
            per: list[list[int]] = [[] for _ in members]
            for p, i in enumerate(ids.tolist()):
                if i >= 0 and self.roots[i] in unit:
                    per[unit[self.roots[i]]].append(p)
            if any(per):
                found.append((leaf, dim, tuple(tuple(x) for x in per)))
        return tuple(found)


def _add(found: list[str], new: list[str]) -> None:
    for reason in new:
        if reason not in found:
            found.append(reason)


def _qualified(mname: str, name: str) -> str:
    return f"{mname}.{name}" if mname else name


def _roots(r: Record, roots: Tensor) -> set[int]:
    return {int(x) for x in roots[r.ids[r.ids >= 0]]}


def _element_slices(
    r: Record, roots: Tensor, makers: set[int], reasons: dict[int, list[str]]
) -> list[Record]:
    """A parameter combined with channels element by element becomes a slice along the one
    dim whose index decides the unit; otherwise its units are blocked."""
    tensor = getattr(r.module, r.name)
    unit = roots[r.ids]
    live = torch.tensor([int(x) in makers for x in unit], dtype=torch.bool)
    if not bool(live.any()):
        return []
    unit = torch.where(live, unit, torch.full_like(unit, -1)).reshape(tensor.shape)
    for dim in range(tensor.dim()):
        if tensor.shape[dim] < 2 and tensor.dim() > 1:
            continue  # a broadcast dim: the unit cannot be decided there
        per = unit.movedim(dim, 0).reshape(tensor.shape[dim], -1)
        if bool((per == per[:, :1]).all()):  # the index along `dim` decides the unit
            ids = per[:, 0]
            keep = ids >= 0
            pos = torch.arange(tensor.shape[dim])[keep]
            return [Record(r.module_name, r.module, r.name, dim, "element", pos, ids[keep])]
    why = f"{_qualified(r.module_name, r.name)} is combined with them along several dims"
    for x in {int(v) for v in unit[unit >= 0]}:
        _add(reasons[x], [why])
    return []


def _groups(
    records: list[Record], roots: Tensor, makers: set[int], reasons: dict[int, list[str]],
    extra: _Extra,
) -> list[ChannelGroup]:  # fmt: skip
    is_maker = torch.zeros(len(roots) + 1, dtype=torch.bool)
    is_maker[torch.tensor(sorted(makers), dtype=torch.long)] = True
    # per record: (unit root, position, input channel) of the live entries
    live: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
    pair_roots, pair_records = [], []  # (root, record) for each record a root has slices in
    for k, r in enumerate(records):
        if r.dim < 0:
            continue
        unit = torch.where(r.ids >= 0, roots[r.ids.clamp_min(0)], torch.full_like(r.ids, -1))
        keep = (unit >= 0) & is_maker[unit.clamp_min(0)] & (r.ids >= 0)
        if not bool(keep.any()):
            continue
        channels = r.channels if r.channels is not None else r.positions
        live[k] = (unit[keep], r.positions[keep], channels[keep])
        found = torch.unique(unit[keep])
        pair_roots.append(found)
        pair_records.append(torch.full_like(found, k))
    if not pair_roots:
        return []
    owned, keyed = _signatures(records, torch.cat(pair_roots), torch.cat(pair_records), reasons)
    groups = [
        _group(records, live, owned[members[0]], members, reasons, extra)
        for members in keyed.values()
    ]  # fmt: skip
    groups.sort(key=lambda g: (g.reason is not None, _order(g)))
    return groups


def _signatures(
    records: list[Record], roots: Tensor, ks: Tensor, reasons: dict[int, list[str]]
) -> tuple[dict[int, list[int]], dict[tuple[Any, ...], list[int]]]:
    """Roots with slices in the same tensors and dims (and both blocked or not) form a group.

    Returns the records of each group's first root and the roots keyed by that signature.
    """
    key_of: dict[tuple[Any, ...], int] = {}
    key_ids = torch.tensor([key_of.setdefault(_key(r), len(key_of)) for r in records])
    keys = key_ids[ks]
    order = torch.argsort(roots * len(key_of) + keys, stable=True)  # by root, then key
    roots, ks, keys = roots[order], ks[order], keys[order]
    distinct, where = torch.unique_consecutive(roots, return_inverse=True)
    counts = torch.bincount(where)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    # one row per root: its sorted keys (a multiset), padded, and whether it is blocked
    table = torch.full((len(distinct), int(counts.max()) + 1), -1, dtype=torch.long)
    table[where, torch.arange(len(roots)) - starts[where]] = keys
    blocked = [r for r in reasons if reasons[r]]
    table[:, -1] = torch.isin(distinct, torch.tensor(blocked, dtype=torch.long)).long()
    _, group_of = torch.unique(table, dim=0, return_inverse=True)
    first_k = torch.full((len(distinct),), len(records), dtype=torch.long)
    first_k.scatter_reduce_(0, where, ks, "amin")
    # in the order the roots first appear in the records
    appear = torch.argsort(first_k * (int(distinct.max()) + 1) + distinct)
    members: dict[int, list[int]] = defaultdict(list)
    group_list = group_of.tolist()
    for i in appear.tolist():
        members[group_list[i]].append(i)
    owned: dict[int, list[int]] = {}
    keyed: dict[tuple[Any, ...], list[int]] = {}
    for rows in members.values():
        roots_of = distinct[rows].tolist()
        i = rows[0]
        first = sorted(ks[starts[i] : starts[i + 1]].tolist())
        owned[roots_of[0]] = first
        signature = tuple(sorted(_key(records[k]) for k in first))
        keyed[(signature, bool(reasons.get(roots_of[0])))] = roots_of
    return owned, keyed


def _key(r: Record) -> tuple[Any, ...]:
    return (r.module_name, r.name, r.dim, r.role)


def _order(g: ChannelGroup) -> tuple[str, int]:
    return (g.slices[0].module_name if g.slices else "", 0)


def _group(
    records: list[Record],
    live: dict[int, tuple[Tensor, Tensor, Tensor]],
    keys: list[int],
    members: list[int],
    reasons: dict[int, list[str]],
    extra: _Extra,
) -> ChannelGroup:
    keys = sorted(keys, key=lambda k: (records[k].role != "out", k))
    # records of the same tensor and dim (a cat of one tensor twice) join one slice
    by_slice: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for k in keys:
        by_slice[_key(records[k])].append(k)
    lookup = {root: u for u, root in enumerate(members)}
    lead_unit, lead_pos = live[keys[0]][0], live[keys[0]][1]
    first: dict[int, int] = {}
    for root, p in zip(lead_unit.tolist(), lead_pos.tolist(), strict=False):
        if root in lookup and root not in first:
            first[root] = p
    members = sorted(members, key=lambda u: (first.get(u, 0), u))
    lookup = {root: u for u, root in enumerate(members)}
    span = max(int(max(members)), max(int(live[k][0].max()) for k in keys)) + 1
    table = torch.full((span,), -1, dtype=torch.long)
    table[torch.tensor(members)] = torch.arange(len(members))
    slices = []
    for ks in by_slice.values():
        r = records[ks[0]]
        per_unit = _per_unit(ks, live, table, len(members), 1)
        per_chan = _per_unit(ks, live, table, len(members), 2) if r.role == "in" else None
        slices.append(Slice(r.module_name, r.module, r.name, r.dim, r.role, per_unit, per_chan,
                            r.op))  # fmt: skip
    reason = None
    kind, blocks = extra.kind(members), extra.blocks(members)
    found: list[str] = []
    for u in members:
        _add(found, reasons[u])
    if blocks and (sum(map(len, blocks)) != len(members) or len({len(b) for b in blocks}) > 1):
        found.append("its key/value groups are not of one size")
    if found:
        reason = "; ".join(found[:3]) + (f" (and {len(found) - 3} more)" if len(found) > 3 else "")
    return ChannelGroup(tuple(slices), len(members), reason, kind, blocks, extra.reached(members))


def _per_unit(
    ks: list[int], live: dict[int, tuple[Tensor, Tensor, Tensor]], table: Tensor, size: int,
    which: int,
) -> tuple[tuple[int, ...], ...]:  # fmt: skip
    """The sorted, distinct positions (or channels) of each unit in these records."""
    units = torch.cat([table[live[k][0]] for k in ks])
    values = torch.cat([live[k][which] for k in ks])
    inside = units >= 0
    units, values = units[inside], values[inside]
    span = int(values.max()) + 1 if len(values) else 1
    codes = torch.unique(units * span + values)
    units, values = codes // span, codes % span
    counts = torch.bincount(units, minlength=size)
    if (
        size and int(counts[0]) and bool((counts == counts[0]).all())
    ):  # as many positions for each unit
        return tuple(map(tuple, values.reshape(size, -1).tolist()))
    flat = values.tolist()
    out, at = [], 0
    for n in counts.tolist():
        out.append(tuple(flat[at : at + n]))
        at += n
    return tuple(out)
