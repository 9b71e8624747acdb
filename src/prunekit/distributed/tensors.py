"""What part of a whole tensor a process holds: all of a plain tensor, or a DTensor's shard.

A DTensor (torch.distributed.tensor, as FSDP2's ``fully_shard`` or ``distribute_tensor``
make) holds a block of its global tensor: `Placement` says where it sits, as runs of entries
contiguous both in the local tensor and in the global one (one run for a shard along
dim 0, one per row for a shard along dim 1, ...), so that ties break by the global
position. Along mesh dims where the DTensor is replicated, only the process at
coordinate 0 counts its entries; the others mark theirs the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from prunekit.core.errors import value_error
from prunekit.select.pieces import Run

__all__ = ["Placement", "is_dtensor", "local", "placement"]


@dataclass(frozen=True)
class Placement:
    """A local tensor's place in its global tensor: global shape, runs, whether it counts."""

    shape: tuple[int, ...]  # the global tensor's
    runs: tuple[Run, ...]
    counts: bool
    sharded: bool  # a DTensor (else a plain tensor: the whole of itself)


def is_dtensor(t: Any) -> bool:
    """Whether `t` is a DTensor (without importing torch.distributed.tensor needlessly)."""
    module = type(t).__module__
    if not module.startswith("torch.distributed"):
        return False
    from torch.distributed.tensor import DTensor  # noqa: PLC0415 (heavy; only for a torch.distributed type)

    return isinstance(t, DTensor)


def local(t: Tensor) -> Tensor:
    """The tensor this process holds: a DTensor's local shard, else `t` itself."""
    if is_dtensor(t):
        held: Tensor = t.to_local()  # type: ignore[attr-defined]
        return held
    return t


def placement(t: Tensor, where: str) -> Placement:
    """Where the local part of `t` lies in the whole; raises ValueError naming `where`
    for placements it cannot follow (Partial, strided shards)."""
    if not is_dtensor(t):
        return Placement(tuple(t.shape), (Run(0, 0, t.numel()),), True, False)
    # Only for a DTensor: `import torch` does not load torch.distributed.tensor, a heavy import.
    from torch.distributed.tensor import Replicate, Shard  # noqa: PLC0415
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC0415

    mesh, placements = t.device_mesh, t.placements  # type: ignore[attr-defined]
    for placement in placements:
        if type(placement) not in (Shard, Replicate):
            raise value_error(
                f"{where} is a DTensor placed {placement}; expected Shard(dim) or "
                "Replicate() placements"
            )
    shape = tuple(t.shape)
    sizes, offsets = compute_local_shape_and_global_offset(shape, mesh, placements)
    coordinate = mesh.get_coordinate()
    counts = coordinate is not None and all(
        c == 0 for c, p in zip(coordinate, placements, strict=True) if isinstance(p, Replicate)
    )
    return Placement(shape, _runs(shape, tuple(sizes), tuple(offsets)), counts, True)


def _runs(
    shape: tuple[int, ...], sizes: tuple[int, ...], offsets: tuple[int, ...]
) -> tuple[Run, ...]:
    """The runs of a block of `sizes` at `offsets` in a row-major tensor of `shape`."""
    numel = 1
    for d in sizes:
        numel *= d
    if numel == 0:
        return (Run(0, 0, 0),)
    partial = [d for d in range(len(shape)) if sizes[d] != shape[d]]
    if not partial:
        return (Run(0, 0, numel),)
    cut = partial[-1]  # dims after it are whole: a run spans them
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    length = sizes[cut] * strides[cut]
    starts = torch.zeros((), dtype=torch.int64)
    for d in range(cut):  # every combination of the outer indices, in order
        steps = (torch.arange(sizes[d], dtype=torch.int64) + offsets[d]) * strides[d]
        starts = (starts.unsqueeze(-1) + steps).reshape(-1)
    first = offsets[cut] * strides[cut]
    globals_ = (starts.reshape(-1) + first).tolist()
    return tuple(Run(i * length, g, length) for i, g in enumerate(globals_))
