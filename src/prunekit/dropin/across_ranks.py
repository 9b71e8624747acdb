"""global_unstructured across the processes of a torch.distributed group.

Every rank passes the tensors it holds: whole tensors (a model split by layers), DTensor
shards (FSDP2's ``fully_shard``, ``distribute_tensor``), or both; each gets exactly the
masks one process holding the whole model would get. That process's list of tensors is
rank 0's list (a DTensor counts there, whole, once), then rank 1's whole tensors, and so
on; ties break by that order, then by the flat position in the whole tensor. Every rank
must list the same DTensors in the same order. Random methods draw from rank 0's
generator (the others' are left as they were), so the noise is the same as in one
process. What travels per call is a sample, counts and histograms (see
prunekit.select.pieces), never the tensors.

The call runs agree.py's protocol: every rank checks its method and tensors, the ranks
compare the method and its arguments, each collective of the selection is preceded by a
status (a criterion failing on one rank reaches the others there), and the masks are
installed inside a transaction that ends with a last status, so that they are installed
on every rank or on none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.amount import Amount
from prunekit.core.checks import check_kind, check_scores
from prunekit.core.errors import attribute_error, describe, naming, type_error, value_error
from prunekit.core.naming import mask_name, orig_name
from prunekit.core.transaction import transaction
from prunekit.criteria.criterion import Criterion
from prunekit.criteria.random import Random
from prunekit.distributed.agree import Collective, collective
from prunekit.distributed.collectives import Group
from prunekit.distributed.tensors import Placement, local, placement
from prunekit.dropin.base_method import construct
from prunekit.dropin.install import install
from prunekit.dropin.torch_methods import CustomFromMask, Pruning
from prunekit.patterns.unstructured import Unstructured
from prunekit.select.pieces import Piece, Unrankable, select

__all__ = ["global_unstructured"]

_OWNER = "global_unstructured"


@dataclass
class _Entry:
    """One listed tensor on this rank: where it lives, its local values and mask."""

    module: nn.Module  # the module the pair named
    name: str
    owner: nn.Module  # the module holding the tensor
    leaf: str
    param: Tensor  # the Parameter (a DTensor where sharded)
    values: Tensor  # local
    alive: Tensor | None  # local mask, None if not pruned yet
    scores: Tensor | None  # local importance scores given
    placement: Placement
    where: str  # how errors name it (with its path, where the caller knows it)


def global_unstructured(
    parameters: Iterable[tuple[nn.Module, str]],
    pruning_method: Any,
    importance_scores: dict[tuple[nn.Module, str], Tensor] | None = None,
    *,
    process_group: Any = None,
    **kwargs: Any,
) -> None:
    """Prune jointly the tensors every rank of `process_group` (None: the default group)
    lists: `amount` counts over all of them, as if one process held them all.

    `pruning_method` is an unstructured prunekit.Pruning class ranking by magnitude:
    L1Unstructured, RandomUnstructured, or Pruning with such a criterion. Every rank must
    call it with the same method and arguments (compared first: see agree.py).

    Args:
        parameters: this rank's (module, name) pairs.
        pruning_method: the Pruning class.
        importance_scores: scores per pair (this rank's part of a DTensor's), instead of
            the tensors' values.
        process_group: a torch.distributed group (None: the default one), or a
            prunekit.distributed.TorchGroup to choose how long a rank waits for the others.
        **kwargs: the method's arguments (`amount`, ...).

    Raises:
        ValueError, TypeError: on every rank, if any rank's input is wrong, the ranks'
            arguments differ, or a criterion fails on a rank (see agree.py for the
            error's type); nothing is pruned on any rank.
        RanksTimeout: a rank waited for the others longer than the group's timeout.
    """
    rank_across(parameters, pruning_method, importance_scores, process_group, kwargs)


def rank_across(
    parameters: Iterable[tuple[nn.Module, str]],
    pruning_method: Any,
    importance_scores: dict[tuple[nn.Module, str], Tensor] | None,
    process_group: Any,
    kwargs: dict[str, Any],
    caller: str = _OWNER,
    paths: Mapping[nn.Module, str] | None = None,
) -> None:
    """global_unstructured's work, for prunekit's whole-model calls too: errors begin with
    `caller`, the function the user called, and name a tensor by its path where `paths`
    (each module's path in the model) has it, as without a group."""
    group = collective(process_group, caller)
    with group.telling():
        method = _method(pruning_method, kwargs, caller)
        given = {} if importance_scores is None else importance_scores
        entries = _entries(parameters, given, caller, paths or {})
        group.start(caller, _digest(pruning_method, method, kwargs))
        keys = _keys(entries, group, caller)
        pieces = _pieces(entries, keys, method.criterion)
        competing = torch.tensor([sum(p.competing or 0 for p in pieces)], dtype=torch.int64)
        with naming(caller):
            k = Amount(method.amount, type(method).__name__).count(int(group.sum(competing)[0]))
        if isinstance(method.criterion, Random) and getattr(method.criterion, "_compact", False):
            _noise(entries, pieces, method.criterion, group)  # after the amount, as in one process
        try:
            selection = select(pieces, lambda total: k, group, owner=caller)
        except Unrankable as bad:
            named = ", ".join(entries[i].where for i in bad.pieces)
            raise value_error(
                f"{caller}: the scores of "
                f"{named or 'a tensor of another rank'} hold NaN or infinity, which cannot be "
                "ranked"
            ) from None
        masks = []
        for i, e in enumerate(entries):
            keep = selection.keep(i, e.values.dtype).view(e.values.shape)
            masks.append(_like(e.param, keep) if e.placement.sharded else keep)
        _install(entries, masks, group)


def _digest(pruning_method: Any, method: Pruning, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments every rank must give alike."""
    digest: dict[str, Any] = {
        "pruning_method": pruning_method,
        "amount": method.amount,
        "criterion": method.criterion,
        "pattern": method.pattern,
    }
    digest.update({k: v for k, v in kwargs.items() if k not in digest})
    return digest


def _method(pruning_method: Any, kwargs: dict[str, Any], caller: str) -> Pruning:
    """The method, checked to be one this selection runs: unstructured, by magnitude."""
    if not (isinstance(pruning_method, type) and issubclass(pruning_method, Pruning)):
        raise type_error(
            f"{caller}: invalid pruning_method={pruning_method!r} for a process group; expected "
            "L1Unstructured, RandomUnstructured or another prunekit.Pruning class"
        )
    # the call's own errors (an unknown keyword) and prunekit's checks named as without a
    # group; a TypeError from inside a constructor (a bug there) travels as it is
    method: Pruning = construct(pruning_method, (), kwargs, caller)
    fits = (
        type(method).compute_mask is Pruning.compute_mask
        and isinstance(method.pattern, Unstructured)
        and method.criterion.by_magnitude
    )
    if not fits:
        raise type_error(
            f"{caller}: pruning_method={pruning_method.__name__} ({method!r}) cannot rank "
            "across processes; expected the Unstructured pattern and a criterion ranking by "
            "magnitude (by_magnitude = True), with compute_mask not overridden"
        )
    return method


def _entries(
    parameters: Iterable[tuple[nn.Module, str]],
    scores: dict[tuple[nn.Module, str], Tensor],
    caller: str,
    paths: Mapping[nn.Module, str],
) -> list[_Entry]:
    if not isinstance(parameters, Iterable):
        raise type_error(
            f"{caller}: invalid parameters of type {type(parameters).__name__}; "
            "expected an iterable of (module, name) pairs"
        )
    if not isinstance(scores, dict):
        raise type_error(
            f"{caller}: invalid importance_scores of type {type(scores).__name__}; expected "
            "a dict keyed by (module, name)"
        )
    found: list[_Entry] = []
    seen: dict[int, str] = {}
    for pair in parameters:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], nn.Module)):
            raise type_error(f"{caller}: invalid entry {pair!r}; expected (module, name) pairs")
        module, name = pair
        where = describe(module, name, paths.get(module))
        path, _, leaf = str(name).rpartition(".")
        try:
            owner = module.get_submodule(path) if path else module
        except AttributeError:
            raise attribute_error(
                f"{where}: {type(module).__name__} has no submodule {path!r}; expected the "
                "name of a parameter of the module or of one of its submodules"
            ) from None
        pruned = isinstance(getattr(owner, orig_name(leaf), None), nn.Parameter)
        param = getattr(owner, orig_name(leaf) if pruned else leaf, None)
        if not isinstance(param, nn.Parameter):
            raise value_error(f"{where} is not a Parameter of the module; expected a parameter")
        if id(param) in seen:
            raise value_error(
                f"{where} is the same Parameter as {seen[id(param)]}, listed before; "
                "expected each parameter once"
            )
        seen[id(param)] = where
        alive = local(getattr(owner, mask_name(leaf)).detach()) if pruned else None
        given = scores.get((module, name))
        values = local(param.detach())
        check_kind(values, where, "the parameter")  # meta: no values to rank
        if given is not None:
            if isinstance(given, Tensor):
                given = local(given.detach())
                if tuple(given.shape) != tuple(values.shape):
                    raise value_error(
                        f"{where}: importance_scores of shape {tuple(given.shape)}; expected "
                        f"the shape of the tensor this rank holds, {tuple(values.shape)}"
                    )
            given = check_scores(given, values, where, alive)  # as without a group
            if not given.is_floating_point():  # integers rank by value, as in one process
                given = given.to(torch.float64)
        if not values.is_floating_point():
            raise type_error(f"{where} is of dtype {values.dtype}; expected floating point")
        lay = placement(param, where)
        if lay.sharded and pruned and values.numel() == 0:
            raise value_error(
                f"{where} is a pruned DTensor whose shard on this rank is empty; expected a "
                "shard on every rank (composing with its earlier mask takes DTensor "
                "reductions, which torch refuses on empty shards)"
            )
        found.append(_Entry(module, name, owner, leaf, param, values, alive, given, lay, where))
    return found


def _keys(entries: list[_Entry], group: Group, caller: str) -> list[int]:
    """Each entry's place in the one list of the whole model (see the module's docstring)."""
    mine = [(e.placement.sharded, e.placement.shape) for e in entries]
    everyone = group.objects(mine)
    sharded = [[shape for is_d, shape in found if is_d] for found in everyone]
    if any(shapes != sharded[0] for shapes in sharded):
        raise value_error(
            f"{caller}: the ranks list different DTensors (global shapes by rank: {sharded}); "
            "expected the same DTensors in the same order on every rank"
        )
    first = [k for k, (is_d, _) in enumerate(everyone[0]) if is_d]
    plain_before = len(everyone[0]) + sum(
        sum(not is_d for is_d, _ in found) for found in everyone[1 : group.rank]
    )
    keys: list[int] = []
    d = p = 0
    for e in entries:
        if group.rank == 0:
            keys.append(len(keys))
        elif e.placement.sharded:
            keys.append(first[d])
            d += 1
        else:
            keys.append(plain_before + p)
            p += 1
    owned = torch.zeros(len(first), dtype=torch.int64)
    shards = [i for i, e in enumerate(entries) if e.placement.sharded]
    for j, i in enumerate(shards):
        owned[j] = entries[i].values.numel() if entries[i].placement.counts else 0
    expected = [_numel(shape) for shape in sharded[0]]
    if group.sum(owned).tolist() != expected:
        raise value_error(
            f"{caller}: the ranks of the group do not hold every shard of their DTensors "
            "exactly once; expected a group covering each DTensor's mesh"
        )
    return keys


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _pieces(entries: list[_Entry], keys: list[int], criterion: Any) -> list[Piece]:
    pieces = []
    for e, key in zip(entries, keys, strict=True):
        lay, values, alive = e.placement, e.values, e.alive
        count = values.numel() if alive is None else int((alive == 1).sum())
        source = _scores(e, criterion)
        competing = count if lay.counts else 0
        ranked = values.dtype if e.scores is None else e.scores.dtype  # what the source gives
        pieces.append(Piece(source, values.numel(), ranked, key, lay.runs, lay.counts, competing))
    return pieces


def _scores(e: _Entry, criterion: Criterion) -> Any:
    """The piece's source: the criterion's scores of its values (or importance scores)."""
    target = (e.owner, e.leaf)
    ranked = e.values if e.scores is None else e.scores

    def read() -> tuple[Tensor, Tensor | None]:
        # entries pruned before do not compete: the selection never reads what they hold
        return criterion._checked_scores(ranked, target), e.alive

    return read


def _noise(entries: list[_Entry], pieces: list[Piece], criterion: Random, group: Group) -> None:
    """Give Random's pieces the noise one process would draw: per whole tensor, for its
    competing entries in order, from rank 0's generator; each piece takes its runs' part."""
    runs = []
    for e, piece in zip(entries, pieces, strict=True):
        per_run = _alive_per_run(e, piece)
        if piece.counts:
            runs += [(piece.key, run.start, n) for run, n in zip(piece.runs, per_run, strict=True)]
    table = sorted(r for found in group.objects(runs) for r in found)
    totals: dict[int, int] = {}
    before: dict[tuple[int, int], int] = {}
    for key, start, n in table:
        before[(key, start)] = totals.get(key, 0)
        totals[key] = before[(key, start)] + n
    keys = sorted(totals)
    if not keys:  # no tensor on any rank (the same table on each): no noise to draw
        return
    stub = [torch.empty(0)] * len(keys)
    state = group.first(torch.get_rng_state())
    if group.rank == 0:
        draws = criterion._compact_sources(stub, [totals[k] for k in keys])
    else:
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state)
            draws = criterion._compact_sources(stub, [totals[k] for k in keys])
    by_key = dict(zip(keys, draws, strict=True))
    for e, piece in zip(entries, pieces, strict=True):
        starts = [before[(piece.key, run.start)] for run in piece.runs]
        piece.source = _noisy(by_key[piece.key], e.alive, _alive_per_run(e, piece), starts)
        piece.dtype = torch.float32


def _alive_per_run(e: _Entry, piece: Piece) -> list[int]:
    if e.alive is None:
        return [run.length for run in piece.runs]
    flags = (e.alive.reshape(-1) == 1).to(torch.int64)
    return [int(flags[r.local : r.local + r.length].sum()) for r in piece.runs]


def _noisy(draw: Any, alive: Tensor | None, per_run: list[int], starts: list[int]) -> Any:
    whole = len(starts) == 1 and starts[0] == 0

    def read() -> tuple[Tensor, Tensor | None]:
        noise = draw()[0]
        if whole and per_run[0] == noise.numel():
            mine = noise
        else:
            spans = [torch.arange(s, s + n) for s, n in zip(starts, per_run, strict=True)]
            mine = noise[torch.cat(spans)]
        if alive is None:
            return mine, None
        flags = alive.reshape(-1) == 1
        full = torch.zeros(flags.numel(), dtype=mine.dtype)
        return full.masked_scatter_(flags, mine), flags

    return read


def _like(param: Tensor, keep: Tensor) -> Tensor:
    """`keep` (this rank's part) as a DTensor placed as `param`."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415 (heavy; only for a DTensor, as tensors.py)

    return DTensor.from_local(
        keep,
        param.device_mesh,  # type: ignore[attr-defined]
        param.placements,  # type: ignore[attr-defined]
        run_check=False,
        shape=param.shape,
        stride=param.stride(),
    )


def _install(entries: list[_Entry], masks: list[Tensor], group: Collective) -> None:
    """Install every mask, or none on any rank: a rank that fails rolls back and tells
    the others at their last step, where they roll back too.

    As in functional.global_unstructured, the masks go in as made here (binary, of the
    tensor's dtype) without the checks custom_from_mask makes of a caller's mask: on a
    DTensor each check is a collective.
    """
    touched = [m for e in entries for m in (e.module, e.owner)]
    with transaction(touched):
        for e, mask in zip(entries, masks, strict=True):
            install(e.module, e.name, CustomFromMask._trusted(mask))
        group.finish()
