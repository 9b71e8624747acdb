"""Models and cases shared by the multi-process tests and the processes they spawn.

Each case builds the same model from its seed in every process. `reference` prunes it in
one process; `run_rank` prunes it as one rank of a gloo group, holding either some of
its layers or a DTensor shard of every weight, and returns what rank 0 must compare.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import prunekit

# Shard(1) over 4 ranks leaves no shard empty; `empty` cases add a (3, 64) weight, whose
# Shard(0) over 4 ranks is empty on rank 3.
SHAPES = [(96, 64), (200, 120), (64, 300), (33, 17), (256, 512), (128, 128), (7, 8), (90, 40)]


@dataclass(frozen=True)
class Case:
    method: str = "l1"
    amount: float = 0.6
    dtype: torch.dtype = torch.float32
    ties: bool = False  # small integers: ties everywhere
    scores: bool = False  # importance scores given
    pruned: bool = False  # every weight pruned once before (a fixed mask)
    scale: int = 1  # rows multiplied: more entries than the selection keeps without a sample
    empty: bool = False  # one more weight, with too few rows for every rank
    options: dict[str, Any] = field(default_factory=dict)


CASES = {
    "l1": Case(),
    "l1_large": Case(scale=4),
    "l1_count": Case(amount=54_321),
    "l1_ties": Case(amount=0.45, ties=True, scale=3),
    "l1_bf16": Case(dtype=torch.bfloat16, scale=3),
    "l1_pruned": Case(amount=0.5, pruned=True, scale=2),
    "importance": Case(scores=True, scale=2),
    "random": Case(method="random", amount=0.3),
    "random_large": Case(method="random", amount=0.7, scale=3),
    "random_pruned": Case(method="random", amount=0.4, pruned=True),
    "l1_empty": Case(empty=True),
    "random_empty": Case(method="random", empty=True),
}
METHODS = {"l1": prunekit.L1Unstructured, "random": prunekit.RandomUnstructured}


def build(case: Case) -> nn.ModuleList:
    """The case's model (the same in every process)."""
    generator = torch.Generator().manual_seed(17)
    layers = nn.ModuleList()
    for rows, cols in [*SHAPES, (3, 64)] if case.empty else SHAPES:
        layer = nn.Linear(cols, rows * case.scale, bias=False)
        with torch.no_grad():
            shape = layer.weight.shape
            values = (
                torch.randint(-4, 5, shape, generator=generator).float()
                if case.ties
                else torch.randn(shape, generator=generator)
            )
            layer.weight.copy_(values)
        layers.append(layer.to(case.dtype))
    return layers


def scores_of(case: Case, layer: nn.Module, index: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 + index)
    return torch.randn(layer.weight.shape, generator=generator)


def first_mask(shape: torch.Size, index: int) -> torch.Tensor:
    """The fixed mask of the cases pruned before."""
    generator = torch.Generator().manual_seed(200 + index)
    return (torch.rand(shape, generator=generator) > 0.3).float()


def reference(name: str) -> list[torch.Tensor]:
    """The masks one process gets."""
    case = CASES[name]
    layers = build(case)
    if case.pruned:
        for i, layer in enumerate(layers):
            prunekit.custom_from_mask(layer, "weight", first_mask(layer.weight.shape, i))
    pairs = [(layer, "weight") for layer in layers]
    scores = {p: scores_of(case, p[0], i) for i, p in enumerate(pairs)} if case.scores else None
    torch.manual_seed(5)
    prunekit.global_unstructured(
        pairs, METHODS[case.method], importance_scores=scores, amount=case.amount
    )
    return [layer.weight_mask for layer in layers]


def owned_layers(rank: int, world: int) -> list[int]:
    """Uneven contiguous blocks, rank 0 first; with 4 ranks, rank 2 holds none."""
    cuts = {2: [0, 3, 9], 4: [0, 1, 4, 4, 9]}[world]
    return list(range(cuts[rank], cuts[rank + 1]))


def by_layers(name: str, rank: int, world: int) -> list[torch.Tensor]:
    """This rank's layers pruned as one rank of the group: their masks."""
    case = CASES[name]
    layers = build(case)
    mine = [i for i in owned_layers(rank, world) if i < len(layers)]
    if case.pruned:
        for i in mine:
            prunekit.custom_from_mask(layers[i], "weight", first_mask(layers[i].weight.shape, i))
    pairs = [(layers[i], "weight") for i in mine]
    scores = {(layers[i], "weight"): scores_of(case, layers[i], i) for i in mine}
    torch.manual_seed(5)
    prunekit.global_unstructured(
        pairs,
        METHODS[case.method],
        importance_scores=scores if case.scores else None,
        amount=case.amount,
        process_group=torch.distributed.group.WORLD,
    )
    return [layers[i].weight_mask for i in mine]


def by_shards(name: str, rank: int, world: int, how: str) -> list[torch.Tensor] | None:
    """Every weight as a DTensor shard (`how`: 'rows' Shard(0), 'columns' Shard(1),
    'fsdp' fully_shard, 'replicas' a 2-D mesh with Replicate and Shard(0)); rank 0
    returns the whole masks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    case = CASES[name]
    layers = build(case)
    if how == "replicas":
        mesh = init_device_mesh("cpu", (2, world // 2))
        placements: list[Any] = [Replicate(), Shard(0)]
    else:
        mesh = init_device_mesh("cpu", (world,))
        placements = [Shard(1) if how == "columns" else Shard(0)]

    def spread(t: torch.Tensor) -> DTensor:
        return distribute_tensor(t, mesh, placements)

    for i, layer in enumerate(layers):
        if how == "fsdp":
            from torch.distributed.fsdp import fully_shard

            fully_shard(layer, mesh=mesh)
        else:
            layer.weight = nn.Parameter(spread(layer.weight.detach()), requires_grad=False)
        if case.pruned:
            mask = first_mask(layer.weight.shape, i).to(case.dtype)
            like = layer.weight
            prunekit.custom_from_mask(
                layer, "weight", distribute_tensor(mask, like.device_mesh, like.placements)
            )
    pairs = [(layer, "weight") for layer in layers]
    scores = None
    if case.scores:
        scores = {}
        for i, p in enumerate(pairs):
            like = p[0].weight_orig if case.pruned else p[0].weight
            given = scores_of(case, p[0], i)
            scores[p] = distribute_tensor(given, like.device_mesh, like.placements)
    torch.manual_seed(5)
    prunekit.global_unstructured(
        pairs,
        METHODS[case.method],
        importance_scores=scores,
        amount=case.amount,
        process_group=torch.distributed.group.WORLD,
    )
    masks = [layer.weight_mask.full_tensor() for layer in layers]
    return masks if rank == 0 else None


def refused(rank: int, world: int) -> str:
    """Rank 1 lists a tensor that is no Parameter; every rank must raise the same error,
    none hang."""
    layers = build(CASES["l1"])
    pairs = [(layers[rank], "weight" if rank != 1 else "bias")]
    try:
        prunekit.global_unstructured(
            pairs, prunekit.L1Unstructured, amount=0.5, process_group=torch.distributed.group.WORLD
        )
    except ValueError as error:
        return f"{type(error).__name__}: {error}; pruned: {prunekit.is_pruned(layers)}"
    return "no error"


def statistics(rank: int, world: int) -> dict[str, torch.Tensor]:
    """Each rank's statistics (different per rank), reduced with its rank + 1 as weight."""
    from prunekit.distributed import all_reduce_statistics

    return all_reduce_statistics(rank_statistics(rank), weight=rank + 1)


def rank_statistics(rank: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(300 + rank)
    return {
        "fc1.hessian": torch.randn(6, 6, generator=generator),
        "fc1.norms": torch.rand(6, generator=generator).double(),
        "fc2.hessian": torch.randn(3, 3, generator=generator),
    }


PRELOAD = [
    "torch",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "prunekit",
    "helpers.distributed_cases",
    "helpers.distributed_calibration",
    "helpers.distributed_hostile",
]
TIMEOUT = 300.0  # seconds a collective may wait for the others, and a group may run in all


def run_job(name: str, how: str, rank: int, world: int) -> Any:
    """One job of a spawned process: (case, how) as the tests name them."""
    if name == "refused":
        return refused(rank, world)
    if name == "statistics":
        return statistics(rank, world)
    if how == "hostile":
        from helpers import distributed_hostile as hostile

        return hostile.run(name, rank, world)
    if how == "calibrated":
        from helpers import distributed_calibration as calibrated

        if name == "refused_calibration":
            return calibrated.refused(rank, world)
        return calibrated.on_rank(name, rank, world)
    if how == "layers":
        return by_layers(name, rank, world)
    return by_shards(name, rank, world, how)


def run_rank(rank: int, world: int, folder: str, jobs: list[tuple[str, str]]) -> None:
    """One spawned process: join the gloo group, run every (case, how) job, save the
    results (or the error) for the test to read."""
    from datetime import timedelta

    start = time.monotonic()
    torch.set_num_threads(1)
    import faulthandler

    import torch.distributed as dist

    faulthandler.enable()  # a collective that aborts still shows where

    # A file rendezvous: no port to choose (gloo's own connections take ports the system
    # gives); a peer that died makes a collective fail after TIMEOUT instead of hanging.
    dist.init_process_group(
        "gloo",
        init_method=f"file://{folder}/rendezvous",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=TIMEOUT),
    )
    results: dict[str, Any] = {"started": time.monotonic() - start}
    try:
        for name, how in jobs:
            key = name if name in ("refused", "statistics") else f"{name}/{how}"
            began = time.monotonic()
            results[key] = run_job(name, how, rank, world)
            results.setdefault("seconds", {})[key] = time.monotonic() - began
    except BaseException:
        results["error"] = traceback.format_exc()
    finally:
        torch.save(results, Path(folder) / f"rank{rank}.pt")
        dist.destroy_process_group()


def spawn(
    world: int, folder: Path, jobs: list[tuple[str, str]], meanwhile: Any = None
) -> list[dict[str, Any]]:
    """Run `jobs` on `world` new processes (forked by a server process where the system
    has one, else spawned), one thread each; each one's results, by rank. Fails (and ends
    the processes) if they take more than TIMEOUT seconds in all. `meanwhile()`, if given,
    runs here while they work."""
    import multiprocessing

    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    if method == "forkserver":
        # The server imports these once (torch.distributed.tensor alone takes seconds: it
        # imports torch._dynamo) and forks each process from itself; it runs no torch op,
        # so no thread is forked. It starts with the first group and serves the others.
        multiprocessing.get_context(method).set_forkserver_preload(PRELOAD)
    context = mp.start_processes(
        run_rank, args=(world, str(folder), jobs), nprocs=world, start_method=method, join=False
    )
    deadline = time.monotonic() + TIMEOUT
    try:
        if meanwhile is not None:
            meanwhile()
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world} spawned processes ran over {TIMEOUT} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join()
    found = [torch.load(folder / f"rank{r}.pt") for r in range(world)]
    for r, results in enumerate(found):
        assert "error" not in results, f"rank {r}:\n{results['error']}"
    return found
