"""The selection kernels' tuning: read at call time, overridden for a block, then restored."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest
import torch
from torch import nn

import prunekit
from prunekit.select import smallest_k, trace, tuning


def paths(scores: torch.Tensor) -> list[str]:
    with trace.recorded() as events:
        smallest_k(scores, 1000)
    return events


def test_an_override_holds_for_its_block_and_nests() -> None:
    scores = torch.rand(5000)
    assert paths(scores) == ["portable"]  # small: the plain calls
    with tuning.overridden(small=0) as outer:
        assert outer.small == 0 and tuning.get() is outer
        assert paths(scores) == ["radix"]  # too few for a sample: the histograms
        with tuning.overridden(guess=0, sample=1024, gather_share=2, gather_capped=False):
            assert tuning.get().small == 0  # the outer override still holds
            assert paths(scores) == ["settle", "one pass"]
        assert paths(scores) == ["radix"]
    assert tuning.get() == tuning.Tuning()
    assert paths(scores) == ["portable"]


def test_an_override_is_undone_when_its_block_raises() -> None:
    with pytest.raises(RuntimeError), tuning.overridden(chunk=7):
        raise RuntimeError
    assert tuning.get().chunk == tuning.Tuning().chunk


def test_an_override_holds_in_its_own_thread_only() -> None:
    seen: list[int] = []
    with tuning.overridden(chunk=7):
        thread = threading.Thread(target=lambda: seen.append(tuning.get().chunk))
        thread.start()
        thread.join()
    assert seen == [tuning.Tuning().chunk]


def test_unknown_names_are_refused() -> None:
    refused = pytest.raises(TypeError, match=r"unknown names \['chunks'\]; expected some of")
    with refused, tuning.overridden(chunks=7):
        pass


class _Spy(prunekit.BasePruningMethod):
    """Records torch's thread count while it computes its mask; fails when asked to."""

    PRUNING_TYPE = "unstructured"
    seen: ClassVar[list[int]] = []

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        _Spy.seen.append(torch.get_num_threads())
        if self.fail:
            raise RuntimeError("boom")
        return default_mask


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    _Spy.seen.clear()
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize(("shape", "expected"), [((100, 10), 1), ((2048, 2048), 2)])
def test_a_tensor_below_one_thread_entries_is_pruned_on_one_thread(
    shape: tuple[int, int], expected: int
) -> None:
    _Spy.apply(nn.Linear(shape[1], shape[0]), "weight")
    assert _Spy.seen == [expected]
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_the_thread_count_is_restored_when_the_pruning_fails() -> None:
    layer = nn.Linear(10, 10)
    with pytest.raises(RuntimeError, match="boom"):
        _Spy.apply(layer, "weight", fail=True)
    assert _Spy.seen == [1]
    assert torch.get_num_threads() == 2
    assert not prunekit.is_pruned(layer)
