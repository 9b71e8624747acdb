"""The multi-process tests that `make test` runs: one group of 2 gloo processes and one of 4,
each running many cases in one process group. The processes are forked from a server that
imported torch once (spawned, each would import torch and DTensor's torch._dynamo itself:
20-40 s here under load instead of 5-10 s). tests/distributed/test_processes.py runs every case
(`make test-distributed`).

Each group checks, against one process: l1, random and importance scores, split by layer
and by DTensor shard (rows, columns, replicas, FSDP2), ties, tensors pruned before;
Wanda, SparseGPT and Taylor calibrated on each rank's own batches; a refused input on one
rank raising on every rank; statistics reduced over the ranks; and the hostile cases of
tests/helpers/distributed_hostile.py (other arguments on one rank, one rank failing before or
between collectives, a rank that never comes): the same error on every rank, within the
group's bound, every model unchanged bit for bit.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import distributed_calibration as calibrated
from helpers import distributed_cases as cases
from helpers import distributed_hostile as hostile

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)

CALIBRATED = [(name, "calibrated") for name in [*calibrated.CALIBRATED, "refused_calibration"]]
HOSTILE = [(name, "hostile") for name in hostile.NAMES]
JOBS = {
    2: [
        *[("l1", "layers"), ("l1_ties", "layers"), ("random", "layers")],
        *[("importance", "layers"), ("l1_pruned", "layers"), ("l1_bf16", "layers")],
        *[("l1", "rows"), ("l1_ties", "columns"), ("importance", "columns")],
        *[("random_pruned", "rows"), ("l1_ties", "replicas"), ("l1", "fsdp")],
        *CALIBRATED,
        ("refused", ""),
        ("statistics", ""),
        *HOSTILE,
    ],
    4: [
        *[("l1_count", "layers"), ("l1_ties", "layers"), ("random_pruned", "layers")],
        *[("importance", "layers"), ("l1_empty", "layers")],
        *[("l1_ties", "rows"), ("l1_pruned", "columns"), ("importance", "rows")],
        *[("random", "columns"), ("random", "replicas"), ("l1_empty", "rows")],
        *CALIBRATED,
        ("refused", ""),
        ("statistics", ""),
        *HOSTILE,
    ],
}


@functools.cache
def reference(name: str) -> list[torch.Tensor]:
    return cases.reference(name)


def differences(got: list[torch.Tensor], want: list[torch.Tensor]) -> str | None:
    """What differs between two lists of masks (None: they are equal)."""
    if len(got) != len(want):
        return f"{len(got)} masks, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"mask {i}: {g.dtype} {tuple(g.shape)}, expected {w.dtype} {tuple(w.shape)}"
        if not torch.equal(g, w):
            return f"mask {i}: {int((g != w).sum())} entries differ"
    return None


@functools.cache
def calibrated_reference(name: str, world: int) -> dict[str, torch.Tensor]:
    return calibrated.reference(name, world)


def references(world: int) -> None:
    """Every reference the group's results are checked against (cached)."""
    for name, how in JOBS[world]:
        if how == "calibrated" and name != "refused_calibration":
            calibrated_reference(name, world)
        elif how not in ("", "calibrated", "hostile"):
            reference(name)


def check(world: int, results: list[dict[str, Any]]) -> list[str]:
    """Every job's result against one process: the failures, named."""
    failures = []
    for name, how in JOBS[world]:
        key = name if name in ("refused", "statistics") else f"{name}/{how}"
        if name == "refused":
            for r in range(world):
                found = results[r]["refused"]
                ok = found.startswith("ValueError") and found.endswith("pruned: False")
                if not ok or found != results[0]["refused"] or "rank(s) [1] of the" not in found:
                    failures.append(f"refused, rank {r}: {found}")
        elif name == "statistics":
            weights = [r + 1 for r in range(world)]
            for stat, tensor in cases.rank_statistics(0).items():
                parts = [cases.rank_statistics(r)[stat].double() * w for r, w in enumerate(weights)]
                want = (sum(parts) / sum(weights)).to(tensor.dtype)
                for r in range(world):
                    if not torch.allclose(results[r]["statistics"][stat], want):
                        failures.append(f"statistics {stat}, rank {r}")
        elif name == "refused_calibration":
            for r in range(world):
                found = results[r][key]
                if not found.endswith("unchanged: True") or "Error" not in found:
                    failures.append(f"{key}, rank {r}: {found}")
            if "rank(s) [1] of the" not in results[0][key]:
                failures.append(f"{key}, rank 0: {results[0][key]}")
            if len({results[r][key] for r in range(world)}) != 1:
                failures.append(f"{key}: the ranks raised different errors")
        elif how == "hostile":
            failures += hostile.check(name, [results[r][key] for r in range(world)])
        elif how == "calibrated":
            want = calibrated_reference(name, world)
            for r in range(world):
                found = calibrated.calibrated_differences(results[r][key], want)
                if found:
                    failures.append(f"{key}, rank {r}: {found}")
        else:
            if how == "layers":
                got = [m for r in range(world) for m in results[r][key]]
            else:
                got = results[0][key]
            found = differences(got, reference(name))
            if found:
                failures.append(f"{key}: {found}")
    return failures


@pytest.mark.parametrize("world", [2, 4], ids=["2 ranks", "4 ranks"])
def test_a_group_gets_the_masks_of_one_process(world: int, tmp_path: Path) -> None:
    # The references are made while the group runs.
    results = cases.spawn(world, tmp_path, JOBS[world], lambda: references(world))
    failures = check(world, results)
    assert not failures, "\n".join(failures)
