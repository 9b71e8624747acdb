"""A slow reference of how a trace becomes groups, written plainly from the rules (dicts, sets
and loops over ids, one at a time), for the differential test of prunekit's vectorized
builder (structure/graph/grouping.py).

The rules:
- an id's unit is its union-find root; units are the roots of ids some 'out' record owns;
- a unit's reasons: those of every blocked set holding one of its ids (in the order they were
  blocked), then parameters combined element-wise along several dims, tensors also used by
  an op the graph does not know, and "they reach the model's output" (unless normalized);
- a parameter combined element-wise with channels becomes a slice along the one dim whose
  index decides the unit (dims of size 1 skipped);
- units with live entries in records of the same keys (module, tensor, dim, role; counted
  with multiplicity) and both blocked or both not form a group; groups come in the order
  their first unit appears (lowest record, then lowest root), units within a group likewise;
- a group's slices: the records of its first unit, 'out' ones first, one slice per key;
- units are ordered by the first position they own in the first of those records;
- a slice holds, per unit, the sorted distinct positions (and, for 'in', channels) of the
  unit's entries in the slice's records;
- prunable groups first, then by the module of the first slice (stable).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from prunekit.structure.graph.groups import ChannelGroup, Slice
from prunekit.structure.trace.tracer import Record, Tracer


def _roots(parent: list[int]) -> list[int]:
    """Each id's root: its parents followed up to an id that is its own."""
    found = []
    for i in range(len(parent)):
        while parent[i] != i:
            i = parent[i]
        found.append(i)
    return found


def reference_groups(tr: Tracer) -> list[ChannelGroup]:
    root = _roots(tr.parent)
    records = [r for r in tr.records if r.role != "element"]
    makers = {root[i] for r in records if r.role == "out" for i in r.ids.tolist() if i >= 0}
    reasons: dict[int, list[str]] = defaultdict(list)

    def add(unit: int, why: str) -> None:
        if why not in reasons[unit]:
            reasons[unit].append(why)

    for ids, why in tr.blocked:
        for unit in {root[i] for i in ids.tolist()}:
            add(unit, why)
    for r in tr.records:
        if r.role == "element":
            records.extend(_element(r, root, makers, add))
    for (mname, name), uses in tr.unclaimed.items():
        for r in records:
            if (r.module_name, r.name) == (mname, name):
                for i in r.ids.tolist():
                    if i >= 0:
                        add(root[i], f"{_qualified(mname, name)} is also used by {uses[0]}")
    normed = {root[i] for i in tr.normed}
    for _, _, ids in tr.outputs:
        for i in ids.tolist():
            if i >= 0 and root[i] not in normed:
                add(root[i], "they reach the model's output")

    # live entries: (unit, position, channel) per record, units that make channels only
    live: dict[int, list[tuple[int, int, int]]] = {}
    records_of: dict[int, set[int]] = defaultdict(set)
    for k, r in enumerate(records):
        if r.dim < 0:
            continue
        channels = (r.channels if r.channels is not None else r.positions).tolist()
        found = []
        for i, p, c in zip(r.ids.tolist(), r.positions.tolist(), channels, strict=True):
            if i >= 0 and root[i] in makers:
                found.append((root[i], p, c))
                records_of[root[i]].add(k)
        live[k] = found

    def signature(unit: int) -> tuple[Any, ...]:
        keys = sorted(_key(records[k]) for k in records_of[unit])
        return (tuple(keys), bool(reasons.get(unit)))

    by_signature: dict[tuple[Any, ...], list[int]] = {}
    for unit in sorted(records_of, key=lambda u: (min(records_of[u]), u)):
        by_signature.setdefault(signature(unit), []).append(unit)
    groups = [_group(members, records, live, records_of, reasons, tr, root)
              for members in by_signature.values()]  # fmt: skip
    groups.sort(key=lambda g: (g.reason is not None, g.slices[0].module_name))
    return groups


def _group(members: list[int], records: list[Record], live: dict[int, list[tuple[int, int, int]]],
           records_of: dict[int, set[int]], reasons: dict[int, list[str]], tr: Tracer,
           root: list[int]) -> ChannelGroup:  # fmt: skip
    mine = sorted(records_of[members[0]], key=lambda k: (records[k].role != "out", k))
    by_key: dict[tuple[Any, ...], list[int]] = {}
    for k in mine:
        by_key.setdefault(_key(records[k]), []).append(k)
    first: dict[int, int] = {}
    for unit, p, _ in live[mine[0]]:
        first.setdefault(unit, p)
    members = sorted(members, key=lambda u: (first.get(u, 0), u))
    index = {unit: u for u, unit in enumerate(members)}
    slices = []
    for ks in by_key.values():
        positions: list[set[int]] = [set() for _ in members]
        channels: list[set[int]] = [set() for _ in members]
        for k in ks:
            for unit, p, c in live[k]:
                if unit in index:
                    positions[index[unit]].add(p)
                    channels[index[unit]].add(c)
        r = records[ks[0]]
        slices.append(Slice(r.module_name, r.module, r.name, r.dim, r.role, _tuples(positions),
                            _tuples(channels) if r.role == "in" else None, r.op))  # fmt: skip
    heads, experts = {root[i] for i in tr.heads}, {root[i] for i in tr.experts}
    normed = {root[i] for i in tr.normed}
    kind = "channels"
    if any(u in heads for u in members):
        kind = "heads"
    elif any(u in experts for u in members):
        kind = "experts"
    elif any(u in normed for u in members):
        kind = "hidden"
    block_of = {}
    for b, ids in enumerate(tr.blocks):
        for i in ids:
            block_of[root[i]] = b
    blocks: dict[int, list[int]] = {}
    for u, unit in enumerate(members):
        if unit in block_of:
            blocks.setdefault(block_of[unit], []).append(u)
    found: list[str] = []
    for unit in members:
        found.extend(why for why in reasons.get(unit, []) if why not in found)
    units = tuple(tuple(b) for b in blocks.values())
    if units and (sum(map(len, units)) != len(members) or len({len(b) for b in units}) > 1):
        found.append("its key/value groups are not of one size")
    reason = None
    if found:
        reason = "; ".join(found[:3]) + (f" (and {len(found) - 3} more)" if len(found) > 3 else "")
    reached = []
    for leaf, dim, ids in tr.outputs:
        per: list[list[int]] = [[] for _ in members]
        for p, i in enumerate(ids.tolist()):
            if i >= 0 and root[i] in index:
                per[index[root[i]]].append(p)
        if any(per):
            reached.append((leaf, dim, tuple(tuple(x) for x in per)))
    return ChannelGroup(tuple(slices), len(members), reason, kind, units, tuple(reached))


def _tuples(sets: list[set[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(sorted(s)) for s in sets)


def _key(r: Record) -> tuple[Any, ...]:
    return (r.module_name, r.name, r.dim, r.role)


def _qualified(mname: str, name: str) -> str:
    return f"{mname}.{name}" if mname else name


def _element(r: Record, root: list[int], makers: set[int], add: Any) -> list[Record]:
    tensor = getattr(r.module, r.name)
    units = [root[i] if root[i] in makers else -1 for i in r.ids.tolist()]
    if all(u < 0 for u in units):
        return []
    shape = tuple(tensor.shape)
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    for dim in range(len(shape)):
        if shape[dim] < 2 and len(shape) > 1:
            continue
        per: dict[int, set[int]] = defaultdict(set)
        for flat, u in enumerate(units):
            per[(flat // strides[dim]) % shape[dim]].add(u)
        if all(len(s) == 1 for s in per.values()):
            ids = [next(iter(per[p])) for p in range(shape[dim])]
            kept = [p for p in range(shape[dim]) if ids[p] >= 0]
            return [Record(r.module_name, r.module, r.name, dim, "element",
                           torch.tensor(kept, dtype=torch.long),
                           torch.tensor([ids[p] for p in kept], dtype=torch.long))]  # fmt: skip
    why = f"{_qualified(r.module_name, r.name)} is combined with them along several dims"
    for u in {u for u in units if u >= 0}:
        add(u, why)
    return []
