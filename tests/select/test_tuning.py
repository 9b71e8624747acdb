"""The selection kernels' tuning: read at call time, overridden for a block, then restored."""

from __future__ import annotations

import threading

import pytest
import torch

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
