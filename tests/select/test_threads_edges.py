"""Hostile cases of select.tuning.torch_threads and threads_for: blocks open in two threads
at once, bad counts of every kind, a pruning that fails inside, torch.set_num_threads
called inside a block, a changed one_thread bound."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

import prunekit as prune
from prunekit.select import tuning


@pytest.fixture(autouse=True)
def _three_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


def in_thread(steps: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=steps)
    thread.start()
    return thread


def test_blocks_open_in_two_threads_at_once_leave_the_count_found_before_both() -> None:
    """Thread A opens a one-thread block, thread B opens one while A's is open (so B finds
    A's count), A leaves first, B last: the process must be back at 3, not at the 1 that B
    found inside A's block."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def first() -> None:
        with tuning.torch_threads(1):
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def second() -> None:
        a_in.wait(5)
        with tuning.torch_threads(1) as found:
            seen["found"] = found
            b_in.set()
            a_out.wait(5)

    threads = [in_thread(first), in_thread(second)]
    for thread in threads:
        thread.join(10)
    assert seen["found"] == 1  # B opened inside A's block
    assert torch.get_num_threads() == 3


def test_nested_blocks_in_one_thread_still_restore_each_count_found() -> None:
    with tuning.torch_threads(2) as outer:
        assert outer == 3
        with tuning.torch_threads(1) as inner:
            assert inner == 2 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        torch.set_num_threads(4)  # the block changes it itself
        with tuning.torch_threads(1) as inner:
            assert inner == 4
        assert torch.get_num_threads() == 4
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize("count", [0, -1, True, False, 2.0, 2.5, "2", None])
def test_a_bad_count_names_itself_and_changes_nothing(count: object) -> None:
    with pytest.raises((TypeError, ValueError)) as raised, tuning.torch_threads(count):  # type: ignore[arg-type]
        pytest.fail("the block ran")
    assert f"count={count!r}" in str(raised.value)
    assert "torch_threads" in str(raised.value)
    assert torch.get_num_threads() == 3
    with tuning.torch_threads(2):  # nothing left half open by the refusal
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 3


def test_a_pruning_that_fails_inside_its_thread_block_restores_the_count() -> None:
    layer = nn.Linear(8, 4)
    before = layer.weight.detach().clone()
    with pytest.raises(ValueError, match="amount"):
        prune.l1_unstructured(layer, "weight", amount=2.5)
    assert torch.get_num_threads() == 3
    assert torch.equal(layer.weight, before) and not prune.is_pruned(layer)


def test_a_small_pruning_runs_on_one_thread_a_large_bound_on_torch_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []
    method = prune.L1Unstructured

    def scores(self: object, t: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return t.abs()

    monkeypatch.setattr(method, "compute_mask", _spying(method.compute_mask, seen))
    prune.l1_unstructured(nn.Linear(8, 4), "weight", amount=0.5)
    with tuning.overridden(one_thread=8):  # 32 entries: no longer small
        prune.l1_unstructured(nn.Linear(8, 4), "weight", amount=0.5)
    assert seen == [1, 3]
    assert torch.get_num_threads() == 3
    del scores


def _spying(real: Callable[..., torch.Tensor], seen: list[int]) -> Callable[..., torch.Tensor]:
    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    return spy
