"""Calibration over data-parallel ranks, with ranks as threads (tests/helpers/thread_group.py): the
statistics reduced where they are made, and failures met on one rank raised on all.
tests/distributed/test_processes_quick.py runs the same over real processes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import prunekit
import prunekit.calibrate as cal
from helpers import distributed_calibration as calibrated
from helpers.thread_group import on_threads
from prunekit.distributed.agree import collective
from prunekit.distributed.collectives import Group
from prunekit.distributed.stats import Reducer

BOTH = cal.Wanted(norms=True, hessian=True)  # the statistics compared across ranks


class Picky(calibrated.Net):
    """Once its first block is pruned, that block refuses batches of 7 (which rank 1 has):
    a failure met while making the next block's inputs."""

    def __init__(self) -> None:
        super().__init__()
        first = self.blocks[0]
        original = first.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            if hasattr(first.q, "weight_mask") and x.shape[0] == 7:
                raise ValueError("seven")
            return original(x)

        first.forward = forward  # type: ignore[method-assign]


def picky() -> Picky:
    model = Picky()
    model.load_state_dict(calibrated.build().state_dict())
    return model


def data(rank: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(rank)
    sizes = [4, 7] if rank == 1 else [4, 2]
    return [torch.randn(n, 3, calibrated.WIDTH, generator=generator) for n in sizes]


def attempt(model: nn.Module, batches: list[Any], group: Any, **options: Any) -> str:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        prunekit.prune_model(model, 0.5, calibration=batches, process_group=group, **options)
    except (ValueError, RuntimeError) as error:
        after = model.state_dict()
        same = after.keys() == before.keys() and all(
            torch.equal(after[k], v) for k, v in before.items()
        )
        return f"{type(error).__name__}: {error}; unchanged: {same}"
    return "no error"


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_failure_making_the_next_inputs_raises_on_every_rank(method: str) -> None:
    found = on_threads(3, lambda g: attempt(picky(), data(g.rank), g, method=method))
    assert "seven" in found[1] and found[1].endswith("unchanged: True"), found[1]
    assert "rank(s) [1] of the 3 failed" in found[1]
    assert found[0] == found[1] == found[2]  # the same error on every rank


def test_a_batch_failing_before_the_blocks_raises_on_every_rank() -> None:
    def run(group: Any) -> str:
        batches = data(group.rank)
        if group.rank == 0:
            batches[0] = torch.randn(2, 3, calibrated.WIDTH + 2)  # refused by the first block
        return attempt(calibrated.build(), batches, group, method="wanda", sequential=False)

    found = on_threads(2, run)
    assert "cannot take batch 0" in found[0] and found[0].endswith("unchanged: True")
    assert "rank(s) [0] of the 2 failed" in found[0] and found[0] == found[1]


def test_a_layer_no_rank_reaches_is_named_on_every_rank() -> None:
    def run(group: Any) -> str:
        even = [b[: 2 * (b.shape[0] // 2)] for b in data(group.rank)]  # the expert never runs
        return attempt(calibrated.build(), even, group, method="wanda")

    for found in on_threads(2, run):
        assert "of Linear never ran on the calibration data" in found, found
        assert found.endswith("unchanged: True")


def test_statistics_are_those_of_all_batches() -> None:
    """Norms and Hessians of 3 ranks' batches, the expert reached on one rank only."""
    world = 3

    def run(group: Any) -> cal.InputStatistics:
        model = calibrated.build()
        reduce = Reducer(collective(group, "calibrate"), "calibrate", {})
        batches = calibrated.batches(group.rank, world)
        return cal.calibrate(model, batches, linears(model), BOTH, owner="test", reduce=reduce)

    found = on_threads(world, run)
    model = calibrated.build()
    every = [b for r in range(world) for b in calibrated.batches(r, world)]
    want = cal.calibrate(model, every, linears(model), BOTH, owner="test")
    for stats in found:
        assert stats.accumulators() == want.accumulators()  # q, k and v still share one
        for mine, one in zip(stats.modules, want.modules, strict=True):
            torch.testing.assert_close(stats.norms(mine), want.norms(one))
            torch.testing.assert_close(stats.hessian(mine), want.hessian(one))


def linears(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def test_process_group_is_refused_where_it_cannot_apply() -> None:
    model = calibrated.build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="process_group with method='l1' and a pattern"):
        prunekit.prune_model(model, 0.5, method="l1", pattern="row", process_group=Group())
    if not torch.distributed.is_initialized():
        with pytest.raises(ValueError, match=r"needs torch\.distributed initialized"):
            prunekit.prune_model(
                model, 0.5, method="wanda", calibration=data(0), process_group=object()
            )
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert not prunekit.is_pruned(model)


def test_layers_is_refused_with_a_process_group_on_every_rank() -> None:
    found = on_threads(
        2,
        lambda g: attempt(
            calibrated.build(), data(g.rank), g, method="sparsegpt", sequential="layers"
        ),
    )
    for one in found:
        assert "expected sequential=True with process_group" in one, one
        assert one.endswith("unchanged: True")


def test_sparsegpt_over_ranks_calibrates_block_by_block_by_default() -> None:
    """Without `sequential`, SparseGPT over a process group calibrates block by block (its
    default 'layers' is refused there)."""

    def run(group: Any, **sequential: Any) -> dict[str, torch.Tensor]:
        model = calibrated.build()
        prunekit.prune_model(
            model, 0.5, method="sparsegpt", calibration=data(group.rank), process_group=group,
            **sequential,
        )  # fmt: skip
        return {k: v.clone() for k, v in model.state_dict().items() if k.endswith("_orig")}

    found = on_threads(2, run)
    told = on_threads(2, lambda g: run(g, sequential=True))
    for mine, want in zip(found, told, strict=True):
        assert all(torch.equal(mine[k], want[k]) for k in want)
