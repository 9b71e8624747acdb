"""Pruning a sharded safetensors checkpoint (a folder with ``model.safetensors.index.json``, as
Hugging Face writes it) that may be larger than memory.

Every tensor is read through a memory map when needed and dropped after; the output is
written tensor by tensor, chunk by chunk, into temporary files renamed into place at the
end. Memory holds about one tensor at a time (global pruning also keeps a small share of
the magnitudes between two passes), never a shard, never the model. The output folder is
staged beside its target and swapped in whole (io.atomic.atomic_folder): a failure or a kill
leaves the old output or none, and no temporary file in it.

The result is the one ``prune_state_dict`` gives on all tensors loaded into one dict in
the order of the index's ``weight_map``: the same methods, the same include/exclude
rules, the same ``<name>_orig``/``<name>_mask`` handling, the same masks. Global pruning
ranks all selected tensors exactly (ties by that order, then position), in two passes
over the shards after a sparse sample.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from prunekit.core.amount import Amount
from prunekit.core.counting import zero_count
from prunekit.core.errors import value_error
from prunekit.core.naming import Entry, entries
from prunekit.criteria import Random
from prunekit.io.atomic import atomic_folder, umask
from prunekit.io.files import CheckpointError, refuse_empty_path, writable_folder
from prunekit.io.mapped import Planned, Stored, Writer, read_header
from prunekit.io.options import Options, Unpack, config_of
from prunekit.io.ranking import ranking
from prunekit.io.statedict import prune_config, seeded
from prunekit.select import Source
from prunekit.select.pieces import Piece, Unrankable, select
from prunekit.select.process_group import Alone
from prunekit.whole.config import Config
from prunekit.whole.registry import METHODS
from prunekit.whole.targets import select_names

__all__ = [
    "INDEX",
    "Checkpoint",
    "ShardedResult",
    "drop_stale_shards",
    "index_of",
    "is_sharded",
    "open_checkpoint",
    "open_tensors",
    "prune_sharded",
    "write_index",
]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"  # one-file weights, which loaders read before an index
ORIG, MASK = "_orig", "_mask"
_STEP = 1 << 22  # entries of a large tensor handled at a time when writing


@dataclass(frozen=True)
class ShardedResult:
    """What a pruning of a sharded checkpoint wrote: the index, the tensors pruned, how
    many entries they hold and how many of those are zero now."""

    index: Path
    pruned: list[str]
    numel: int
    zeros: int


def index_of(path: str | os.PathLike[str]) -> Path | None:
    """The index file of a sharded checkpoint: `path` itself if it is a ``*.index.json``
    file, the ``model.safetensors.index.json`` inside `path` if it is a folder, else None."""
    where = Path(path)
    if where.is_dir():
        found = where / INDEX
    elif where.name.endswith(".index.json"):
        found = where
    else:
        return None
    if not found.exists():
        return None
    if not found.is_file():  # a directory, FIFO, device or socket
        raise CheckpointError(
            f"{found}: is not a regular file; expected the JSON index of a sharded checkpoint"
        )
    return found


def is_sharded(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a sharded safetensors checkpoint (its folder or its index)."""
    return index_of(path) is not None


@dataclass
class Checkpoint:
    """A sharded checkpoint's index, its metadata, every tensor (where its bytes are) and
    each shard file's header metadata."""

    index: Path
    metadata: dict[str, Any]
    tensors: dict[str, Stored]  # in the weight_map's order
    files: dict[str, dict[str, str]]  # shard file name -> its header's metadata


def _open(path: str | os.PathLike[str]) -> Checkpoint:
    index = index_of(path)
    if index is None:
        raise CheckpointError(f"{path}: no {INDEX} here; expected a sharded checkpoint's folder")
    try:
        found = json.loads(index.read_text())
        weight_map = found["weight_map"]
        assert isinstance(weight_map, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise CheckpointError(f"{index}: not an index of shards (no weight_map)") from None
    tensors: dict[str, Stored] = {}
    files: dict[str, dict[str, str]] = {}
    headers: dict[str, dict[str, Stored]] = {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
            raise CheckpointError(f"{index}: {name!r} is in {file!r}; expected a file name")
        if file not in headers:
            headers[file], files[file] = read_header(index.parent / file)
        if name not in headers[file]:
            raise CheckpointError(f"{index}: {name!r} is not in {file}, where the index says")
        tensors[name] = headers[file][name]
    for stored in headers.values():  # tensors the index leaves out still belong
        for name, entry in stored.items():
            tensors.setdefault(name, entry)
    metadata = found.get("metadata")
    return Checkpoint(index, dict(metadata) if isinstance(metadata, dict) else {}, tensors, files)


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The sharded checkpoint at `path` (its folder or index): every tensor's place, read
    from the index and the shards' headers (no tensor data is read).

    Raises:
        CheckpointError: no index there, or an index or header that is not valid.
    """
    return _open(path)


def write_index(
    folder: Path, metadata: dict[str, Any], weight_map: dict[str, str], size: int
) -> Path:
    """Write ``model.safetensors.index.json`` into `folder` whole (a temporary file renamed
    into place): `metadata` with ``total_size`` set to `size`, and `weight_map`.

    Returns:
        The index's path.
    """
    return _write_index(folder, metadata, weight_map, size)


def prune_sharded(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *args: str | float,
    config: Config | None = None,
    keep_masks: bool = False,
    seed: int | None = None,
    **options: Unpack[Options],
) -> ShardedResult:
    """Prune the sharded checkpoint at `path` into the folder `out` (made if missing): the
    same shard files and an index, pruned as prune_state_dict prunes all its tensors in
    one dict. The tensors are read from the shards as they are needed (a checkpoint larger
    than memory prunes), and the output folder is swapped in whole once written: a failure
    or a kill leaves it as it was. Every argument is checked before a shard is read.

    ``prune_sharded(folder, out, 0.5, method="l1", scope="global")`` or, the same,
    ``prune_sharded(folder, out, config=Config(method="l1", amount=0.5, scope="global"))``.

    Args:
        path: a sharded safetensors checkpoint: its folder, or its
            ``model.safetensors.index.json``. ``<name>_orig`` + ``<name>_mask`` pairs are
            pruned further.
        out: the output folder, apart from the input one (its parent must exist); it gets
            the same shard files and the index, or, on any failure, stays as it was.
        *args: the amount (the old order, the method before it, with a FutureWarning).
        config: every argument of the pruning in one prunekit.whole.Config, instead of
            the amount and `options`.
        keep_masks: write ``<name>_orig`` and ``<name>_mask`` (see prune_state_dict).
        seed: seeds the 'random' method.
        **options: the fields of the Config by keyword, as prune_state_dict takes them
            (`method`, `amount`, `n`, `dim`, `scope`, `include`, `exclude`, and
            ``global_pruning=``, the old name of ``scope='global'``).

    Returns:
        The index written, the names pruned, their entries and zeros.

    Raises:
        TypeError: an argument or glob of the wrong type.
        ValueError: an argument or glob out of range, or a method the arguments do not fit.
        CheckpointError: a checkpoint or folder that cannot be read or written, or too
            little free disk for the output (the output left as it was).
    """
    refuse_empty_path("prune_sharded", "out", out)  # Path("") is ".": the current folder
    checked = config_of("prune_sharded", args, config, options)
    ranking(checked)  # before any shard is read
    checkpoint = _open(path)
    found = entries({name: s.meta() for name, s in checkpoint.tensors.items()})
    targets = set(select_names(found, checked.include, checked.exclude))
    folder = writable_folder(out, "the shards", checkpoint.index.parent)
    plans, weight_map = _plan(checkpoint, found, targets, keep_masks)
    _check_room(plans, folder)
    with atomic_folder(folder) as stage:  # the shards and index swapped in whole
        writer = Writer(stage, plans, {f: checkpoint.files.get(f, {}) for f in plans})
        with _committing(writer), seeded(seed, "prune_sharded"):
            done = _write(checkpoint, found, targets, writer, checked, keep_masks)
        _write_index(stage, checkpoint.metadata, weight_map, sum(writer.sizes.values()))
    pruned = [e.name for e in found if e.name in targets]
    return ShardedResult(folder / INDEX, pruned, done[0], done[1])


@contextmanager
def _committing(writer: Writer) -> Iterator[None]:
    """Commit what `writer` wrote once the block ends, or abort it on any failure."""
    try:
        yield
        writer.commit()
    except BaseException:
        writer.abort()
        raise


def _check_room(plans: dict[str, list[Planned]], folder: Path) -> None:
    """Refuse an output larger than the free disk beside `folder`."""
    need = sum(p.nbytes for file in plans.values() for p in file)
    free = shutil.disk_usage(folder.parent).free
    if need > free:
        raise CheckpointError(f"{folder}: the output needs {need:,} bytes, {free:,} are free")


def _plan(
    checkpoint: Checkpoint, found: list[Entry], targets: set[str], keep_masks: bool
) -> tuple[dict[str, list[Planned]], dict[str, str]]:
    """The output tensors per shard file, and the new weight map. A pruned tensor (or
    one saved with a mask) goes where its values were, a mask saved anew beside it."""
    plans: dict[str, list[Planned]] = {}
    weight_map: dict[str, str] = {}
    stored = checkpoint.tensors

    def put(name: str, like: Stored, file: str) -> None:
        plans.setdefault(file, []).append(Planned(name, like.code, like.shape))
        weight_map[name] = file

    for e in found:
        values = stored[e.name + ORIG] if e.mask is not None else stored[e.name]
        if e.mask is not None and stored[e.name + MASK].shape != values.shape:
            raise value_error(  # as prune_state_dict names it (io.ranking.saved_mask)
                f"tensor {e.name!r}: the mask {e.name + MASK!r} has shape "
                f"{stored[e.name + MASK].shape}; expected the tensor's shape {values.shape}"
            )
        if e.mask is None and e.name not in targets:
            put(e.name, values, values.path.name)
        elif keep_masks:
            put(e.name + ORIG, values, values.path.name)
            mask = stored[e.name + MASK] if e.mask is not None else values
            put(e.name + MASK, values, mask.path.name)
        else:
            put(e.name, values, values.path.name)
    return plans, weight_map


def _write(
    checkpoint: Checkpoint,
    found: list[Entry],
    targets: set[str],
    writer: Writer,
    config: Config,
    keep_masks: bool,
) -> tuple[int, int]:
    """Write every output tensor, in the order of `found`; returns how many entries the
    pruned tensors hold and how many of them are zero."""
    stored = checkpoint.tensors
    chosen = None
    if config.scope == "global":
        chosen = _global(stored, found, targets, config.method, config.amount)
    one = replace(config, scope="layer")  # a tensor of scope 'layer', alone
    numel = zeros = 0
    for e in found:
        values = stored[e.name + ORIG] if e.mask is not None else stored[e.name]
        mask = stored[e.name + MASK] if e.mask is not None else None
        if e.mask is None and e.name not in targets:
            writer.copy(e.name, values)
            continue
        if e.name in targets and chosen is None:
            state = _loaded(e.name, values, mask)
            alone = replace(one, include=(glob.escape(e.name),), exclude=())
            result = prune_config(state, alone, keep_masks)
            for key, tensor in result.state.items():
                writer.write(key, 0, tensor.reshape(-1))
            final = result.state.get(e.name)
            if final is None:
                final = result.state[e.name + ORIG] * result.state[e.name + MASK]
            numel, zeros = numel + final.numel(), zeros + int((final == 0).sum())
            continue
        kept = chosen(e.name) if chosen is not None and e.name in targets else None
        z = _apply(e.name, values, mask, kept, writer, keep_masks)
        if e.name in targets:
            numel, zeros = numel + values.numel, zeros + z
    return numel, zeros


def _loaded(name: str, values: Stored, mask: Stored | None) -> dict[str, Tensor]:
    """The state_dict of one entry, in memory (a copy: pruning must not touch the file)."""
    if mask is None:
        return {name: values.load().clone()}
    return {name + ORIG: values.load().clone(), name + MASK: mask.load().clone()}


def _apply(
    name: str,
    values: Stored,
    mask: Stored | None,
    kept: Iterator[tuple[int, Tensor]] | None,
    writer: Writer,
    keep_masks: bool,
) -> int:
    """Write a tensor with its mask (the stored one, times the 0/1 chunks `kept`), chunk
    by chunk; returns how many of its entries are zero with the mask applied."""
    if keep_masks:
        writer.copy(name + ORIG, values)
    flat = values.load().reshape(-1)
    alive = None if mask is None else mask.load().reshape(-1)
    if kept is None:
        kept = (
            (s, torch.ones(min(_STEP, flat.numel() - s))) for s in range(0, flat.numel(), _STEP)
        )
    zeros = 0
    for start, chunk in kept:
        end = start + chunk.numel()
        share = chunk.to(flat.dtype)
        if alive is not None:
            part = alive[start:end]
            if part.dtype != torch.bool:
                _check_binary(name, part, start, values.shape)
            share.mul_(part == 1)
        product = flat[start:end] * share
        zeros += zero_count(product)
        if keep_masks:
            writer.write(name + MASK, start, share)
        else:
            writer.write(name, start, product)
    return zeros


def _check_binary(name: str, part: Tensor, start: int, shape: tuple[int, ...]) -> None:
    """Refuse a chunk of a saved mask (from flat entry `start` of a tensor of `shape`) that
    holds other values than 0 and 1, naming the tensor, a value and its index, as
    prune_state_dict names them."""
    bad = (part != 0) & (part != 1)
    if not bool(bad.any()):
        return
    at = int(bad.nonzero()[0, 0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(start + at), shape))
    raise CheckpointError(
        f"tensor {name!r}: the mask {name + MASK!r} holds value(s) other than 0 and 1, e.g. "
        f"{part[at].item()!r} at index {index}; expected only 0 and 1 (or False and True)"
    )


def _global(
    stored: dict[str, Stored], found: list[Entry], targets: set[str], method: str, amount: float
) -> Callable[[str], Iterator[tuple[int, Tensor]]]:
    """The global selection over the targets, streamed: a function of a target's name
    giving its chosen entries chunk by chunk."""
    chosen = [e for e in found if e.name in targets]
    pruning = METHODS[method].pruning
    assert pruning is not None
    owner = pruning.__name__
    pieces = []
    for key, e in enumerate(chosen):
        values = stored[e.name + ORIG] if e.mask is not None else stored[e.name]
        mask = stored[e.name + MASK] if e.mask is not None else None
        if not values.dtype.is_floating_point:
            raise CheckpointError(f"tensor {e.name!r} is of {values.code}; expected floats")
        pieces.append(Piece(_source(values, mask), values.numel, values.dtype, key))
    if method == "random":
        counts = [_count(p) for p in pieces]
        k = Amount(amount, owner).count(sum(counts))  # before any draw, as in memory
        noises = Random()._compact_sources([torch.empty(0)] * len(pieces), counts)
        for piece, noise, count in zip(pieces, noises, counts, strict=True):
            piece.source, piece.competing = _noisy(piece.source, noise), count
            piece.dtype = torch.float32
        selection = select(pieces, lambda total: k, Alone(), owner=owner)
    else:
        try:
            selection = select(pieces, Amount(amount, owner).count, Alone(), owner=owner)
        except Unrankable as error:
            names = ", ".join(repr(chosen[i].name) for i in error.pieces)
            raise CheckpointError(
                f"tensors {names} hold NaN or infinity, which cannot be ranked"
            ) from None
    where = {e.name: i for i, e in enumerate(chosen)}
    return lambda name: selection.kept(where[name])


def _source(values: Stored, mask: Stored | None) -> Source:
    def read() -> tuple[Tensor, Tensor | None]:
        # the entries the saved mask pruned do not compete: the selection never reads them
        return values.load(), None if mask is None else mask.load()

    return read


def _count(piece: Piece) -> int:
    _, alive = piece.source()
    if alive is None:
        return piece.numel
    return int((alive if alive.dtype == torch.bool else alive == 1).sum())


def _noisy(read: Source, noise: Source) -> Source:
    """A source of noise for the competing entries, in their places."""

    def draw() -> tuple[Tensor, Tensor | None]:
        _, alive = read()
        drawn = noise()[0]
        if alive is None:
            return drawn, None
        flags = alive.reshape(-1)
        flags = flags if flags.dtype == torch.bool else flags == 1
        full = torch.zeros(flags.numel(), dtype=drawn.dtype)
        return full.masked_scatter_(flags, drawn), flags

    return draw


def _write_index(
    folder: Path, metadata: dict[str, Any], weight_map: dict[str, str], size: int
) -> Path:
    target = folder / INDEX
    found = {"metadata": {**metadata, "total_size": size}, "weight_map": weight_map}
    text = json.dumps(found, indent=2)
    fd, temp = tempfile.mkstemp(prefix=f".{INDEX}.", dir=folder)
    try:
        os.chmod(temp, 0o666 & ~umask())  # a new file's permissions, not mkstemp's 0o600
        with os.fdopen(fd, "w") as stream:
            stream.write(text + "\n")
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _drop_stale_weights(folder, set(weight_map.values()))
    return target


_SHARD = re.compile(r"model-\d+-of-\d+\.safetensors")
"""The names save_pretrained (and the writers here) give shards."""


def _drop_stale_weights(folder: Path, shards: set[str]) -> None:
    """Remove from `folder` (a stage holding an earlier output's files) the weights of an
    earlier model beside the index just written: ``model.safetensors``, which loaders read
    before any index (it would be loaded instead of the new shards), and shards of
    save_pretrained's names that the index does not list. Other files stay."""
    for path in folder.iterdir():
        name = path.name
        weights = name == SINGLE or _SHARD.fullmatch(name) is not None
        if weights and name not in shards and path.is_file():
            path.unlink()


def drop_stale_shards(folder: Path) -> None:
    """Remove from `folder` (a stage holding an earlier output's files) the index and the
    shards of save_pretrained's names an earlier sharded model left there, before a single
    ``model.safetensors`` is written: readers of the index (``prunekit report``) would read
    the old shards instead. Other files stay.

    Args:
        folder: the stage of the output folder.
    """
    for path in folder.iterdir():
        stale = path.name == INDEX or _SHARD.fullmatch(path.name) is not None
        if stale and path.is_file():
            path.unlink()


def open_tensors(path: str | os.PathLike[str]) -> Iterator[dict[str, Tensor]]:
    """The sharded checkpoint at `path`, one entry at a time in the index's order: a tensor
    by its name, or a pruned one as its ``<name>_orig`` and ``<name>_mask`` (loaded from
    the memory-mapped shards when reached, dropped by the caller)."""
    checkpoint = _open(path)
    stored = checkpoint.tensors
    for e in entries({name: s.meta() for name, s in stored.items()}):
        if e.mask is None:
            yield {e.name: stored[e.name].load()}
        else:
            yield {
                e.name + ORIG: stored[e.name + ORIG].load(),
                e.name + MASK: stored[e.name + MASK].load(),
            }
