"""The protocol of collective calls (prunekit/distributed/agree.py), with ranks as threads
(tests/helpers/thread_group.py): failures told at the next step, the last step inside the
transaction, ranks out of step, arguments made comparable; and the checks of weights and
timeouts that need no group. tests/distributed/test_processes_quick.py runs the hostile cases over
real processes."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from helpers.thread_group import on_threads
from prunekit.core.errors import value_error
from prunekit.distributed import TorchGroup, all_reduce_statistics
from prunekit.distributed.agree import canonical, collective
from prunekit.distributed.collectives import Group


class Stubborn(nn.Linear):
    """A Linear that refuses forward pre-hooks: installing a pruning on it fails after the
    selection, the last thing global pruning does."""

    def register_forward_pre_hook(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no hooks here")


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    after = model.state_dict()
    return after.keys() == before.keys() and all(
        torch.equal(after[k], v) for k, v in before.items()
    )


def test_a_rank_failing_to_install_undoes_every_rank() -> None:
    def rank(group: Group) -> tuple[str, str, bool]:
        torch.manual_seed(group.rank)
        made = nn.ModuleList(
            [nn.Linear(6, 5), Stubborn(6, 5) if group.rank == 1 else nn.Linear(6, 5)]
        )
        before = _state(made)
        try:
            prunekit.global_unstructured(
                [(m, "weight") for m in made],
                prunekit.L1Unstructured,
                amount=0.5,
                process_group=group,
            )
        except RuntimeError as error:
            return (
                type(error).__name__,
                str(error),
                _same(made, before) and not prunekit.is_pruned(made),
            )
        return "", "no error", False

    found = on_threads(3, rank)
    assert found[1] == ("RuntimeError", "no hooks here", True)  # its own error, as it is
    for r in (0, 2):
        kind, text, unchanged = found[r]
        assert kind == "RuntimeError" and unchanged, found[r]
        assert "rank(s) [1] of the 3 failed" in text and "no hooks here" in text, text
    assert found[0] == found[2]


def test_a_rank_failing_between_steps_is_told_at_the_next() -> None:
    """Rank 0 fails after the first sum; rank 1 is at its second: both raise the same."""

    def rank(group: Group) -> str:
        call = collective(group, "test")
        try:
            with call.telling():
                call.start("test", {"amount": 0.5})
                call.sum(torch.ones(1))
                if group.rank == 0:
                    raise value_error("test: the work failed on purpose")
                call.sum(torch.ones(1))
        except ValueError as error:
            return str(error)
        return "no error"

    found = on_threads(2, rank)
    assert found[0] == found[1]
    assert "rank(s) [0] of the 2 failed" in found[0] and "failed on purpose" in found[0]


def test_ranks_out_of_step_raise_on_every_rank() -> None:
    def rank(group: Group) -> str:
        call = collective(group, "test")
        try:
            if group.rank == 0:
                call.sum(torch.ones(1))
            else:
                call.finish()
        except RuntimeError as error:
            return str(error)
        return "no error"

    for text in on_threads(2, rank):
        assert "out of step" in text, text


def test_arguments_differ_on_every_rank_with_their_values() -> None:
    def rank(group: Group) -> str:
        call = collective(group, "test")
        try:
            call.start("test", {"amount": [0.5, 0.9, 0.5][group.rank], "pattern": "2:4"})
        except ValueError as error:
            return str(error)
        return "no error"

    found = on_threads(3, rank)
    assert found[0] == found[1] == found[2]
    assert "amount: 0.5 on rank(s) [0, 2], 0.9 on rank(s) [1]" in found[0]
    assert "pattern" not in found[0]  # only what differs


def test_arguments_are_compared_by_value() -> None:
    assert canonical(0.5) == canonical(torch.tensor(0.5).item())
    assert canonical(5) != canonical(5.0)  # a count, a fraction
    assert canonical(prunekit.Magnitude()) == canonical(prunekit.Magnitude())
    assert canonical(prunekit.NM(2, 4)) != canonical(prunekit.PerRow())
    assert canonical(object()) == canonical(object()) == "object"  # no address
    assert canonical(torch.ones(2, 3)) == canonical(torch.zeros(2, 3))
    assert canonical(prunekit.L1Unstructured) != canonical(prunekit.RandomUnstructured)


@pytest.mark.parametrize(
    ("weight", "error"),
    [
        (math.inf, ValueError),
        (math.nan, ValueError),
        (-1.0, ValueError),
        ("many", TypeError),
        (True, TypeError),
        ({"a": math.inf}, ValueError),
        ({"a": [1.0]}, TypeError),
    ],
)
def test_a_weight_that_is_no_finite_number_is_refused(weight: Any, error: type) -> None:
    stats = {"a": torch.eye(2)}
    with pytest.raises(error, match=r"all_reduce_statistics: invalid weight.*finite number >= 0"):
        all_reduce_statistics(stats, Group(), weight=weight)
    assert torch.equal(stats["a"], torch.eye(2))


def test_weights_whose_products_overflow_still_average() -> None:
    def rank(group: Group) -> dict[str, torch.Tensor]:
        stats = {"a": torch.full((2,), 1e10 * group.rank, dtype=torch.float64)}
        return all_reduce_statistics(stats, group, weight=1e300)  # 1e310: past float64

    for stats in on_threads(2, rank):
        assert torch.allclose(stats["a"], torch.full((2,), 0.5e10, dtype=torch.float64))


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("5", TypeError),
        (True, TypeError),
    ],
)
def test_a_timeout_that_is_no_positive_number_is_refused(timeout: Any, error: type) -> None:
    with pytest.raises(error, match="TorchGroup: invalid timeout"):
        TorchGroup(None, timeout=timeout)


@pytest.mark.parametrize("method", [prunekit.L1Unstructured, prunekit.RandomUnstructured])
def test_no_tensor_on_any_rank_prunes_nothing(method: type) -> None:
    """As in one process, where an empty list is no work (not a failure to draw noise)."""

    def rank(group: Group) -> str:
        prunekit.global_unstructured([], method, amount=0.5, process_group=group)
        return "done"

    assert on_threads(2, rank) == ["done", "done"]


def test_statistics_given_in_another_order_are_summed_by_name() -> None:
    def rank(group: Group) -> dict[str, torch.Tensor]:
        a, b = torch.full((2,), 1.0 + group.rank), torch.full((3,), 10.0 * (1 + group.rank))
        norms = torch.ones(3, dtype=torch.float64)
        stats = {"a": a, "b": b, "n": norms}
        if group.rank == 1:
            stats = {"n": norms, "b": b, "a": a}
        return all_reduce_statistics(stats, group, weight={"b": group.rank + 1.0})

    first, second = on_threads(2, rank)
    assert list(second) == ["n", "b", "a"]  # each rank's own order
    for found in (first, second):
        assert torch.equal(found["a"], torch.full((2,), 3.0))
        assert torch.allclose(found["b"], torch.full((3,), (10.0 + 2 * 20.0) / 3))
        assert torch.equal(found["n"], torch.full((3,), 2.0, dtype=torch.float64))
