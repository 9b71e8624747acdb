"""Resolving a trace into groups: the tracer's ids become units, units with slices in the same
tensors become one group. Every record is handled in one pass of tensor operations (no loop
over groups or slices touches a tensor); Python only cuts the sorted positions into tuples.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
from torch import Tensor

from prunekit.structure.graph.groups import ChannelGroup, Pending, Slice, Units
from prunekit.structure.trace.tracer import Record, Tracer, compressed


def build_groups(tr: Tracer) -> list[ChannelGroup]:
    """Resolve the tracer's ids into units and the units into groups."""
    roots = compressed(tr.parents().clone())
    records = [r for r in tr.records if r.role != "element"]
    made = [r.ids for r in records if r.role == "out"]
    made_ids = torch.cat(made) if made else torch.zeros(0, dtype=torch.long)
    is_maker = torch.zeros(len(roots) + 1, dtype=torch.bool)  # the last: an id of -1
    is_maker[roots[made_ids[made_ids >= 0]]] = True
    reasons = _blocked(tr, roots, is_maker)
    for r in tr.records:
        if r.role == "element":
            records.extend(_element_slices(r, roots, is_maker, reasons))
    by_tensor: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in records:
        by_tensor[(r.module_name, r.name)].append(r)
    for (mname, name), uses in tr.unclaimed.items():
        why = f"{_qualified(mname, name)} is also used by {uses[0]}"
        for r in by_tensor.get((mname, name), []):
            for x in torch.unique(roots[r.ids[r.ids >= 0]]).tolist():
                _add(reasons[x], why)
    normed = set(_roots_of(roots, tr.normed))
    reached = "they reach the model's output"
    for _, _, ids in tr.outputs:
        for x in torch.unique(roots[ids[ids >= 0]]).tolist():
            if x not in normed:
                found = reasons[x]
                if reached not in found:
                    found.append(reached)
    in_blocks = [i for ids in tr.blocks for i in ids]
    block_ids = [b for b, ids in enumerate(tr.blocks) for _ in ids]
    extra = _Extra(
        heads=set(_roots_of(roots, tr.heads)),
        experts=set(_roots_of(roots, tr.experts)),
        normed=normed,
        block_of=dict(zip(_roots_of(roots, in_blocks), block_ids, strict=True)),
    )
    return _groups(records, roots, is_maker, reasons, extra, tr.outputs)


def _roots_of(roots: Tensor, ids: Collection[int]) -> list[int]:
    """The root of each of these ids, in their order (a set's in its own)."""
    if not ids:
        return []
    found: list[int] = roots[torch.tensor(list(ids), dtype=torch.long)].tolist()
    return found


def _blocked(tr: Tracer, roots: Tensor, is_maker: Tensor) -> dict[int, list[str]]:
    """The reasons of each unit (a root that makes channels), in the order they were found,
    each text once."""
    reasons: dict[int, list[str]] = defaultdict(list)
    if not tr.blocked:
        return reasons
    count = len(tr.blocked)
    first: dict[str, int] = {}  # each text's first entry
    text = torch.tensor([first.setdefault(why, k) for k, (_, why) in enumerate(tr.blocked)])
    ids = torch.cat([ids for ids, _ in tr.blocked])
    which = torch.repeat_interleave(
        torch.arange(count), torch.tensor([len(ids) for ids, _ in tr.blocked])
    )
    unit = roots[ids]
    keep = is_maker[unit]
    unit, which = unit[keep], which[keep]
    # each (unit, text) once, at its first entry; then by unit, and by entry within a unit
    pairs, inverse = torch.unique(unit * count + text[which], return_inverse=True)
    earliest = torch.full((len(pairs),), count, dtype=torch.long)
    earliest.scatter_reduce_(0, inverse, which, "amin")
    codes = torch.sort((pairs // count) * count + earliest).values
    units, sizes = torch.unique_consecutive(codes // count, return_counts=True)
    texts = [why for _, why in tr.blocked]
    whys = [texts[b] for b in (codes % count).tolist()]
    listed = units.tolist()
    if len(whys) == len(listed):  # one reason each (most units): no cutting
        reasons.update(zip(listed, [[why] for why in whys], strict=True))
        return reasons
    at = 0
    for x, n in zip(listed, sizes.tolist(), strict=True):
        reasons[x] = whys[at : at + n]
        at += n
    return reasons


@dataclass
class _Extra:
    """What the tracer knows of units beyond slices: heads, experts, normalized widths."""

    heads: set[int]
    experts: set[int]
    normed: set[int]
    block_of: dict[int, int]

    def kinds(self, members: Tensor, member_group: Tensor, size: int, count: int) -> list[str]:
        """The kind of each of `count` groups: 'heads' if any of its units is a head, else
        'experts' if any is one, else 'hidden' if any is normalized, else 'channels'.
        `members`: the units of every group, `member_group` the group of each, all < `size`."""
        found = ["channels"] * count
        for kind, roots in (("hidden", self.normed), ("experts", self.experts),
                            ("heads", self.heads)):  # fmt: skip
            if roots:  # later kinds override earlier ones
                marked = torch.zeros(size, dtype=torch.bool)
                marked[torch.tensor(list(roots), dtype=torch.long)] = True
                for g in torch.unique(member_group[marked[members]]).tolist():
                    found[g] = kind
        return found

    def blocks(self, members: list[int]) -> tuple[tuple[int, ...], ...]:
        if not self.block_of:
            return ()
        found: dict[int, list[int]] = defaultdict(list)
        for u, root in enumerate(members):
            if root in self.block_of:
                found[self.block_of[root]].append(u)
        return tuple(tuple(units) for units in found.values())


def _add(found: list[str], reason: str) -> None:
    if reason not in found:
        found.append(reason)


def _qualified(mname: str, name: str) -> str:
    return f"{mname}.{name}" if mname else name


def _element_slices(
    r: Record, roots: Tensor, is_maker: Tensor, reasons: dict[int, list[str]]
) -> list[Record]:
    """A parameter combined with channels element by element becomes a slice along the one
    dim whose index decides the unit; otherwise its units are blocked. A buffer becomes a
    slice of role 'buffer': it goes with its units when they are removed, never masked (what
    it adds to a masked channel is a constant that ``compact`` folds into the consumers)."""
    tensor = getattr(r.module, r.name)
    role = "buffer" if r.name in r.module._buffers else "element"
    unit = roots[r.ids]
    live = is_maker[unit]
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
            return [Record(r.module_name, r.module, r.name, dim, role, pos, ids[keep])]
    why = f"{_qualified(r.module_name, r.name)} is combined with them along several dims"
    for x in torch.unique(unit[unit >= 0]).tolist():
        _add(reasons[x], why)
    return []


@dataclass
class _Entries:
    """The live entries of every distinct record content, flat: content, unit (root),
    position, channel."""

    content: Tensor
    unit: Tensor
    position: Tensor
    channel: Tensor

    def take(self, keep: Tensor) -> _Entries:
        """The entries at these indices."""
        return _Entries(self.content.index_select(0, keep), self.unit.index_select(0, keep),
                        self.position.index_select(0, keep),
                        self.channel.index_select(0, keep))  # fmt: skip


def _contents(
    records: list[Record],
) -> tuple[list[int], list[Record], list[tuple[int, ...]], list[int]]:
    """The content of each record (-1 for those with no dim), one record per content, the
    keys of each content's records (sorted; key ids numbered over the records), the contents
    numbered in the order of their keys, and the key id of each record.

    Records share a content when they hold the very same ids, positions and channels tensors
    (a norm's weight, bias and statistics; a layer's weight and bias): their entries are
    built once and told apart only when cut into slices.
    """
    seen: dict[tuple[int, int, int], int] = {}
    content: list[int] = []
    firsts: list[Record] = []
    for r in records:
        if r.dim < 0:
            content.append(-1)
            continue
        key = (id(r.ids), id(r.positions), id(_channels(r)))
        c = seen.get(key)
        if c is None:
            c = seen[key] = len(firsts)
            firsts.append(r)
        content.append(c)
    key_of: dict[tuple[Any, ...], int] = {}
    held: list[list[int]] = [[] for _ in firsts]
    key_ids = []
    for r, c in zip(records, content, strict=True):
        key_id = key_of.setdefault(_key(r), len(key_of))
        key_ids.append(key_id)
        if c >= 0:
            held[c].append(key_id)
    keys = [tuple(sorted(h)) for h in held]
    order = sorted(range(len(firsts)), key=lambda c: (keys[c], c))
    number = [0] * len(firsts)
    for new, c in enumerate(order):
        number[c] = new
    return ([number[c] if c >= 0 else -1 for c in content], [firsts[c] for c in order],
            [keys[c] for c in order], key_ids)  # fmt: skip


def _entries(firsts: list[Record], roots: Tensor, is_maker: Tensor) -> _Entries:
    if not firsts:
        empty = torch.zeros(0, dtype=torch.long)
        return _Entries(empty, empty, empty, empty)
    ids = torch.cat([r.ids for r in firsts])
    content = torch.repeat_interleave(
        torch.arange(len(firsts)), torch.tensor([len(r.ids) for r in firsts])
    )
    position = torch.cat([r.positions for r in firsts])
    channel = torch.cat([_channels(r) for r in firsts])
    # ids are >= -1: an id of -1 reads the root appended last (-1), which makes nothing
    unit = torch.cat([roots, torch.full((1,), -1, dtype=torch.long)])[ids]
    keep = is_maker[unit].nonzero().squeeze(1)
    return _Entries(content, unit, position, channel).take(keep)


def _channels(r: Record) -> Tensor:
    """The input channel each position reads (role 'in'), else the positions."""
    return r.positions if r.channels is None else r.channels


def _expand(codes: Tensor, table: dict[int, list[int]], span: int) -> tuple[Tensor | None,
                                                                             Tensor]:  # fmt: skip
    """For each code (all in ``range(span)``), every value table[code] lists (none where
    absent): (which code, value); which is None when it is every code, once each."""
    keys = torch.tensor(sorted(table), dtype=torch.long)
    lists = [table[k] for k in keys.tolist()]
    counts = torch.tensor([len(v) for v in lists], dtype=torch.long)
    values = torch.tensor([v for vs in lists for v in vs], dtype=torch.long)
    if len(values) == len(keys) and span <= 4 * len(codes) + _DENSE:  # one value per code
        dense = torch.full((span,), -1, dtype=torch.long)  # looked up, not searched
        dense[keys] = values
        value = dense[codes]
        if bool((value >= 0).all()):
            return None, value
        which = (value >= 0).nonzero().squeeze(1)
        return which, value[which]
    at = torch.searchsorted(keys, codes).clamp_max(len(keys) - 1)
    found = keys[at] == codes
    if bool((counts == 1).all()):  # one value per code (most tables): no expansion
        which = found.nonzero().squeeze(1)
        return which, values[at[which]]
    starts = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    n = torch.where(found, counts[at], 0)
    which = torch.repeat_interleave(torch.arange(len(codes)), n)
    first = torch.repeat_interleave(starts[at] - (n.cumsum(0) - n), n)
    return which, values[first + torch.arange(len(which))]


def _groups(
    records: list[Record], roots: Tensor, is_maker: Tensor, reasons: dict[int, list[str]],
    extra: _Extra, outputs: list[tuple[int, int, Tensor]],
) -> list[ChannelGroup]:  # fmt: skip
    content_of, firsts, content_keys, key_ids = _contents(records)
    live = _entries(firsts, roots, is_maker)
    if not len(live.unit):
        return []
    kinds = len(firsts)
    by_content: dict[int, list[int]] = defaultdict(list)
    for k, c in enumerate(content_of):
        if c >= 0:
            by_content[c].append(k)
    pairs = _distinct(live.unit * kinds + live.content)  # (unit, content) it has entries in
    grouped, all_members, sizes = _signatures(records, by_content, content_keys, pairs // kinds,
                                              pairs % kinds, reasons)  # fmt: skip
    positions, channels = _Cuts(), _Cuts()  # what each part holds: filled in below
    parts = _parts(records, grouped, content_of, key_ids, kinds, (positions, channels))
    group_of = torch.full((len(roots),), -1, dtype=torch.long)
    member_group = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    group_of[all_members] = member_group
    g_entry = group_of[live.unit]  # every live unit is in a group (its pairs made them)
    unit_of, ranked = _unit_order(live, g_entry, all_members, member_group, parts.lead,
                                  len(roots))  # fmt: skip
    # the parts of each live entry: its unit's group with the content of its record
    which, p_entry = _expand(g_entry * kinds + live.content, parts.table, len(sizes) * kinds)
    u_entry, position, channel = unit_of[live.unit], live.position, live.channel
    if which is not None:
        u_entry, position, channel = u_entry[which], position[which], channel[which]
    part_sizes = [sizes[g] for g in parts.groups]
    positions.fill(p_entry, u_entry, position, part_sizes)
    if all(parts.reads):
        channels.fill(p_entry, u_entry, channel, part_sizes)
    elif any(parts.reads):
        take = torch.tensor(parts.reads, dtype=torch.bool)[p_entry].nonzero().squeeze(1)
        channels.fill(p_entry[take], u_entry[take], channel[take], part_sizes)
    reached = _reached(outputs, roots, group_of, unit_of, sizes)
    blocked = _blocked_members(reasons, group_of, unit_of)
    kinds_of = extra.kinds(all_members, member_group, len(roots), len(sizes))
    blocks = _blocks(extra, ranked, sizes)
    groups = [
        _group(parts.slices[g], sizes[g], kinds_of[g], blocks[g],
               [reasons[u] for u in blocked.get(g, ())], reached.get(g, ()))
        for g in range(len(sizes))
    ]  # fmt: skip
    groups.sort(key=lambda g: (g.reason is not None, _order(g)))
    return groups


def _blocks(extra: _Extra, ranked: Tensor, sizes: list[int]) -> list[tuple[tuple[int, ...], ...]]:
    """Each group's units in order, listed by the blocks they belong to (none: empty)."""
    blocks: list[tuple[tuple[int, ...], ...]] = [()] * len(sizes)
    if extra.block_of:
        flat, at = ranked.tolist(), 0
        for g, n in enumerate(sizes):
            blocks[g] = extra.blocks(flat[at : at + n])
            at += n
    return blocks


@dataclass
class _Parts:
    """Each group's slices, and the parts they fall in: the slices of one group whose records
    have the same contents share their cut (a part)."""

    slices: list[tuple[Slice, ...]] = field(default_factory=list)
    lead: list[int] = field(default_factory=list)  # each group's lead content: its first record's
    groups: list[int] = field(default_factory=list)  # each part's group
    reads: list[bool] = field(default_factory=list)  # whether a slice of the part reads ('in')
    table: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    # group x kinds + content -> parts


def _parts(
    records: list[Record], grouped: list[list[int]], content_of: list[int], key_ids: list[int],
    kinds: int, cuts: tuple[_Cuts, _Cuts],
) -> _Parts:  # fmt: skip
    """Each group's records: those of its first unit, 'out' ones first; one slice per key,
    each cut from `cuts` (the positions, and the channels of the parts that read)."""
    positions, channels = cuts
    found = _Parts()
    part_of: dict[tuple[int, tuple[int, ...]], int] = {}
    part_cuts: list[_Cut] = []  # each part's pending positions, shared by its slices
    channel_cuts: dict[int, _Cut] = {}  # and channels, for the parts that read
    rank = _places(records)
    for g, rks in enumerate(grouped):
        keys: dict[int, list[int]] = {}
        for k in sorted(rks, key=rank.__getitem__):
            keys.setdefault(key_ids[k], []).append(k)
        slices = []
        for rs in keys.values():
            held = tuple(sorted({content_of[k] for k in rs})) if len(rs) > 1 else (
                content_of[rs[0]],
            )  # fmt: skip
            part = part_of.get((g, held))
            if part is None:
                part = part_of[(g, held)] = len(found.groups)
                found.groups.append(g)
                found.reads.append(False)
                part_cuts.append(_Cut(positions, part))
                for c in held:
                    found.table[g * kinds + c].append(part)
            r = records[rs[0]]
            read = None
            if r.role == "in":
                found.reads[part] = True
                read = channel_cuts.get(part)
                if read is None:
                    read = channel_cuts[part] = _Cut(channels, part)
            slices.append(Slice.pending(r.module_name, r.module, r.name, r.dim, r.role,
                                        part_cuts[part], read, r.op))  # fmt: skip
        found.slices.append(tuple(slices))
        found.lead.append(content_of[next(iter(keys.values()))[0]])
    return found


def _places(records: list[Record]) -> list[int]:
    """Each record's place: 'out' ones first, then in order."""
    rank = [0] * len(records)
    later = [r.role != "out" for r in records]
    placed = [k for k, x in enumerate(later) if not x] + [k for k, x in enumerate(later) if x]
    for place, k in enumerate(placed):
        rank[k] = place
    return rank


def _distinct(codes: Tensor) -> Tensor:
    """The distinct codes (all >= 0), sorted: as 32-bit integers when they fit (a sort of
    half the bytes)."""
    if len(codes) and int(codes.max()) < 1 << 31:
        narrow: Tensor = torch.unique_consecutive(torch.sort(codes.int()).values)
        return narrow.long()
    found: Tensor = torch.unique(codes)
    return found


def _unit_order(
    live: _Entries, g_entry: Tensor, all_members: Tensor, member_group: Tensor,
    lead_content: list[int], size: int,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The index of each unit (root) in its group and the units of every group in that order
    (group after group): by where they first appear in the group's lead record (the first
    'out' one), whose content is given per group. `all_members`: the units of every group,
    group after group, `member_group` the group of each; `g_entry`: the group of each live
    entry."""
    lead = torch.tensor(lead_content, dtype=torch.long)
    at_lead = (live.content == lead[g_entry]).nonzero().squeeze(1)  # entry indices
    first = torch.full((size,), len(live.unit), dtype=torch.long)
    first.scatter_reduce_(0, live.unit[at_lead], at_lead, "amin")
    seen = first[all_members] < len(live.unit)
    position = torch.cat([live.position, torch.zeros(1, dtype=torch.long)])
    first_pos = torch.where(seen, position[first[all_members]], 0)
    span = int(all_members.max()) + 1
    order = torch.argsort((member_group * (int(first_pos.max()) + 1) + first_pos) * span
                          + all_members)  # fmt: skip
    starts = torch.searchsorted(member_group, member_group)  # each group's first index
    unit_of = torch.full((size,), -1, dtype=torch.long)
    ranked = all_members[order]
    unit_of[ranked] = torch.arange(len(ranked)) - starts[order]
    return unit_of, ranked


class _Cuts:
    """The values of every unit of many slices (see `_cut`), cut into tuples when one of the
    slices is first read: most callers of the graph read the indices of few groups or none."""

    def __init__(self) -> None:
        self._made: tuple[Tensor, Tensor, Tensor, list[int]] | None = None
        self._found: list[Units] = []

    def fill(self, slot: Tensor, unit: Tensor, value: Tensor, sizes: list[int]) -> None:
        """What the slices hold (the arguments of `_cut`), before any is read."""
        self._made = (slot, unit, value, sizes)

    def _get(self, k: int) -> Units:
        if self._made is not None:
            self._found = _cut(*self._made)
            self._made = None
        return self._found[k]


class _Cut(Pending[Units]):
    """Slice k of some `_Cuts`, pending."""

    __slots__ = ("cuts", "k")

    def __init__(self, cuts: _Cuts, k: int) -> None:
        self.cuts, self.k = cuts, k

    def make(self) -> Units:
        return self.cuts._get(self.k)


def _cut(slot: Tensor, unit: Tensor, value: Tensor, sizes: list[int]) -> list[
    tuple[tuple[int, ...], ...]
]:  # fmt: skip
    """Per slice, the sorted distinct values of each of its units (empty ones included)."""
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    at = torch.tensor(starts[:-1], dtype=torch.long)
    place = at[slot] + unit if len(slot) else slot
    span = int(value.max()) + 1 if len(value) else 1
    codes = torch.unique(place * span + value)
    place, value = codes // span, codes % span
    counts = torch.bincount(place, minlength=starts[-1])
    per_slice = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    low = torch.full((len(sizes),), 1 << 62, dtype=torch.long)
    high = torch.zeros(len(sizes), dtype=torch.long)
    low.scatter_reduce_(0, per_slice, counts, "amin")
    high.scatter_reduce_(0, per_slice, counts, "amax")
    flat, counted = value.tolist(), counts.tolist()
    found: list[tuple[tuple[int, ...], ...]] = []
    at_value = 0
    for k, (n, lo, hi) in enumerate(zip(sizes, low.tolist(), high.tolist(), strict=True)):
        if n and lo == hi:  # as many values for each unit
            part = flat[at_value : at_value + n * lo]
            found.append(tuple(zip(*[iter(part)] * lo, strict=True)) if lo else ((),) * n)
            at_value += n * lo
            continue
        units = []
        for c in counted[starts[k] : starts[k + 1]]:
            units.append(tuple(flat[at_value : at_value + c]))
            at_value += c
        found.append(tuple(units))
    return found


def _reached(
    outputs: list[tuple[int, int, Tensor]], roots: Tensor, group_of: Tensor, unit_of: Tensor,
    sizes: list[int],
) -> dict[int, tuple[tuple[int, int, tuple[tuple[int, ...], ...]], ...]]:  # fmt: skip
    """Per group: (output index, dim, positions of each unit) of the outputs it reaches."""
    found: dict[int, list[tuple[int, int, tuple[tuple[int, ...], ...]]]] = defaultdict(list)
    for leaf, dim, ids in outputs:
        position = torch.arange(len(ids))[ids >= 0]
        unit = roots[ids[ids >= 0]]
        g = group_of[unit]
        position, unit, g = position[g >= 0], unit[g >= 0], g[g >= 0]
        for group in torch.unique(g).tolist():
            mine = g == group
            per = _cut(torch.zeros(int(mine.sum()), dtype=torch.long), unit_of[unit[mine]],
                       position[mine], [sizes[group]])[0]  # fmt: skip
            found[group].append((leaf, dim, per))
    return {g: tuple(v) for g, v in found.items()}


def _signatures(
    records: list[Record], by_content: dict[int, list[int]],
    content_keys: list[tuple[int, ...]], roots: Tensor, cs: Tensor,
    reasons: dict[int, list[str]],
) -> tuple[list[list[int]], Tensor, list[int]]:  # fmt: skip
    """Units with slices in the same tensors and dims (and both blocked or not) form a group.

    `roots` and `cs`: each (unit, content) pair that has entries, sorted by unit, then content
    (contents are numbered in the order of their keys); `by_content`: the records of each
    content; `content_keys`: their keys. Units are first told apart by the contents' kinds (the keys
    of their records), then the classes with the same keys over all their records are joined.
    Returns, per group in the order its first unit appears in the records, the records of
    that first unit; the units of every group, group after group (each in the same order of
    appearance); and the size of each group.
    """
    kind_of: dict[tuple[int, ...], int] = {}
    kinds = [kind_of.setdefault(keys, len(kind_of)) for keys in content_keys]
    content_first = torch.tensor([min(by_content[c]) for c in range(len(by_content))])
    keys = torch.tensor(kinds, dtype=torch.long)[cs]  # in order within each root
    distinct, where = torch.unique_consecutive(roots, return_inverse=True)
    counts = torch.bincount(where)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    first_k = torch.full((len(distinct),), len(records), dtype=torch.long)
    first_k.scatter_reduce_(0, where, content_first[cs], "amin")
    # in the order the roots first appear in the records
    appear = torch.argsort(first_k * (int(distinct.max()) + 1) + distinct)
    # a root's signature: its sorted kinds (a multiset) and whether it is blocked
    blocked = torch.zeros(int(distinct.max()) + 1, dtype=torch.long)
    bound = len(blocked)
    with_reasons = [root for root, found in reasons.items() if found and root < bound]
    blocked[torch.tensor(with_reasons, dtype=torch.long)] = 1
    flag = blocked[distinct]
    classes = _same_runs(keys, where, starts, flag)
    # classes with the same keys over all their records (and flag) are one signature
    n_classes = int(classes.max()) + 1
    one = torch.full((n_classes,), len(distinct), dtype=torch.long)
    one.scatter_reduce_(0, classes, torch.arange(len(distinct)), "amin")
    merged: dict[tuple[Any, ...], int] = {}
    joined = []
    for held_cs, blocked_root in zip(_runs(cs, starts, one), flag[one].tolist(), strict=True):
        held = sorted(k for c in held_cs for k in content_keys[c])
        joined.append(merged.setdefault((blocked_root, *held), len(merged)))
    signature = torch.tensor(joined, dtype=torch.long)[classes]
    # groups in the order their first root appears, each root after those before it
    rank = torch.empty_like(appear)
    rank[appear] = torch.arange(len(appear))
    first = torch.full((int(signature.max()) + 1,), len(appear), dtype=torch.long)
    first.scatter_reduce_(0, signature, rank, "amin")
    group_rank = torch.empty_like(first)
    group_rank[torch.argsort(first)] = torch.arange(len(first))
    by_group = torch.argsort(group_rank[signature] * len(appear) + rank)
    sizes = torch.bincount(group_rank[signature]).tolist()
    leads = by_group[torch.cumsum(torch.tensor([0, *sizes[:-1]]), 0)]
    found = []
    for held in _runs(cs, starts, leads):
        found.append(sorted(k for c in held for k in by_content[c]))
    return found, distinct[by_group], sizes


def _runs(values: Tensor, starts: Tensor, picked: Tensor) -> list[list[int]]:
    """The values of each picked run (run r: ``values[starts[r]:starts[r + 1]]``), read
    without listing the others."""
    low, sizes = starts[picked], starts[picked + 1] - starts[picked]
    begin = torch.cumsum(sizes, 0) - sizes
    at = torch.repeat_interleave(low - begin, sizes) + torch.arange(int(sizes.sum()))
    flat, cut = values[at].tolist(), sizes.tolist()
    found, k = [], 0
    for n in cut:
        found.append(flat[k : k + n])
        k += n
    return found


def _same_runs(values: Tensor, run: Tensor, starts: Tensor, flag: Tensor) -> Tensor:
    """A number per run (the values of run r are ``values[starts[r]:starts[r + 1]]``, with
    its flag), equal for equal runs only: each run hashed to one number (checked exact, else
    compared whole)."""
    counts = starts[1:] - starts[:-1]
    at = torch.arange(len(values)) - starts[run]  # each value's place in its run
    codes = _run_hashes(values, at, starts, flag)
    inverse: Tensor = torch.unique(codes, return_inverse=True)[1]
    first = torch.full((len(counts),), len(counts), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(counts)), "amin")
    lead = first[inverse]
    same = torch.equal(counts, counts[lead]) and torch.equal(flag, flag[lead])
    if same and torch.equal(values, values[starts[lead][run] + at]):
        return inverse
    rows = torch.full((len(counts), int(counts.max()) + 1), -1, dtype=torch.long)
    rows[run, at] = values  # two runs hashed alike: compared whole
    rows[:, -1] = flag
    exact: Tensor = torch.unique(rows, dim=0, return_inverse=True)[1]
    return exact


def _run_hashes(values: Tensor, at: Tensor, starts: Tensor, flag: Tensor) -> Tensor:
    """Each run's hash modulo 2**64 (wrapping around): ``(count + 1) * H + flag`` plus
    ``(value + 2) * H**(j + 2)`` over the values of the run (`at`: each one's place j in its
    run), the terms of a run summed as a difference of running sums over all values."""
    counts = starts[1:] - starts[:-1]
    weights = torch.tensor([pow(_HASH, j + 1, 1 << 64) for j in range(int(counts.max()) + 1)],
                           dtype=torch.uint64).view(torch.long)  # fmt: skip
    sums = torch.cat([torch.zeros(1, dtype=torch.long), ((values + 2) * weights[at + 1]).cumsum(0)])
    return (counts + 1) * weights[0] + flag + (sums[starts[1:]] - sums[starts[:-1]])


_DENSE = 1 << 16  # a table of codes this wide is looked up densely, whatever the codes' count

_HASH = 0x9E3779B97F4A7C15  # an odd multiplier: any two rows that differ are unlikely alike


def _key(r: Record) -> tuple[Any, ...]:
    return (r.module_name, r.name, r.dim, r.role)


def _order(g: ChannelGroup) -> tuple[str, int]:
    return (g.slices[0].module_name if g.slices else "", 0)


def _blocked_members(
    reasons: dict[int, list[str]], group_of: Tensor, unit_of: Tensor
) -> dict[int, list[int]]:
    """Per group, its units (roots) that have reasons, in the group's order of units."""
    roots = torch.tensor([root for root, found in reasons.items() if found], dtype=torch.long)
    if not len(roots):
        return {}
    group, unit = group_of[roots], unit_of[roots]
    inside = group >= 0
    roots, group, unit = roots[inside], group[inside], unit[inside]
    order = torch.argsort(group * (int(unit.max()) + 1 if len(unit) else 1) + unit)
    found: dict[int, list[int]] = defaultdict(list)
    for g, root in zip(group[order].tolist(), roots[order].tolist(), strict=True):
        found[g].append(root)
    return found


def _group(
    slices: tuple[Slice, ...], size: int, kind: str, blocks: tuple[tuple[int, ...], ...],
    reasons: list[list[str]], reached: tuple[tuple[int, int, tuple[tuple[int, ...], ...]], ...],
) -> ChannelGroup:  # fmt: skip
    """A group of `size` units; `reasons`: those of its units that have any, in order."""
    found = list(dict.fromkeys(chain.from_iterable(reasons)))  # each text once, in order
    if blocks and (sum(map(len, blocks)) != size or len({len(b) for b in blocks}) > 1):
        found.append("its key/value groups are not of one size")
    reason = None
    if found:
        reason = "; ".join(found[:3]) + (f" (and {len(found) - 3} more)" if len(found) > 3 else "")
    return ChannelGroup(slices, size, reason, kind, blocks, reached)
