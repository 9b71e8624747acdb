"""Global pruning across processes (gloo, 2 and 4 ranks): the masks one process gets.

Two spawned groups (2 and 4 processes) run every case once; each test compares one case
with the single-process masks, bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import distributed_calibration as calibrated
from helpers import distributed_cases as cases

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(
        not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
        reason="needs torch.distributed with gloo",
    ),
]

SHARDED = {
    "rows": [
        *("l1", "l1_large", "l1_bf16", "l1_pruned", "l1_empty"),
        *("importance", "random", "random_pruned", "random_empty"),
    ],
    "columns": ["l1_ties", "l1_pruned", "importance", "random_pruned"],
    "fsdp": ["l1", "random_large"],
    "replicas": ["l1_ties", "random", "l1_pruned"],
}
JOBS = [(name, "layers") for name in cases.CASES] + [
    (name, how) for how, names in SHARDED.items() for name in names
]
OTHER = [("refused", ""), ("statistics", "")]
CALIBRATED = [(name, "calibrated") for name in [*calibrated.CALIBRATED, "refused_calibration"]]


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder: Path = tmp_path_factory.mktemp(f"group{request.param}")
    return request.param, cases.spawn(request.param, folder, JOBS + OTHER + CALIBRATED)


def assert_masks(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, i
        assert torch.equal(g, w), f"layer {i}: {int((g != w).sum())} entries differ"


@pytest.mark.parametrize("name", list(cases.CASES))
def test_layers_split_by_rank(ranks: Any, name: str) -> None:
    world, results = ranks
    got = [m for r in range(world) for m in results[r][f"{name}/layers"]]
    assert_masks(got, cases.reference(name))


@pytest.mark.parametrize(("name", "how"), [job for job in JOBS if job[1] != "layers"])
def test_dtensor_shards(ranks: Any, name: str, how: str) -> None:
    _, results = ranks
    assert_masks(results[0][f"{name}/{how}"], cases.reference(name))


def test_a_refused_input_raises_on_every_rank(ranks: Any) -> None:
    world, results = ranks
    for r in range(world):
        found = results[r]["refused"]
        assert found.startswith("ValueError") and found.endswith("pruned: False"), found
    assert "parameter 'bias'" in results[1]["refused"]
    assert "rank(s) [1] of the" in results[0]["refused"]
    assert len({results[r]["refused"] for r in range(world)}) == 1  # the same error on all


def test_statistics_are_the_weighted_mean_over_ranks(ranks: Any) -> None:
    world, results = ranks
    weights = [r + 1 for r in range(world)]
    for name, tensor in cases.rank_statistics(0).items():
        parts = [cases.rank_statistics(r)[name].double() * w for r, w in enumerate(weights)]
        want = (sum(parts) / sum(weights)).to(tensor.dtype)
        for r in range(world):
            got = results[r]["statistics"][name]
            assert got.dtype == tensor.dtype
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", list(calibrated.CALIBRATED))
def test_calibrated_on_each_ranks_batches(ranks: Any, name: str) -> None:
    world, results = ranks
    want = calibrated.reference(name, world)
    for r in range(world):
        found = calibrated.calibrated_differences(results[r][f"{name}/calibrated"], want)
        assert found is None, f"rank {r}: {found}"


def test_a_calibration_failing_on_one_rank_raises_on_every_rank(ranks: Any) -> None:
    world, results = ranks
    for r in range(world):
        found = results[r]["refused_calibration/calibrated"]
        assert found.endswith("unchanged: True"), found
        # Every rank raises the same error (distributed/agree.py), naming the rank that failed
        # and the batch it could not take.
        assert "rank(s) [1] of the" in found, found
        assert (
            "rank 1: ValueError: prune_model: calibration: the model cannot take batch 1" in found
        ), found
        assert found == results[0]["refused_calibration/calibrated"], (r, found)
