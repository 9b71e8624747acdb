"""The channel tracer's union-find: merging many pairs at once gives the sets and roots that
merging them one by one gives (a root is the smallest id of its set)."""

from __future__ import annotations

import pytest
import torch

from prunekit.structure.graph import trace
from prunekit.structure.graph.trace import Tracer


def _roots(tracer: Tracer) -> list[int]:
    return [tracer.find(i) for i in range(len(tracer.parent))]


@pytest.mark.parametrize("seed", range(6))
def test_merging_many_pairs_at_once_equals_one_by_one(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = torch.Generator().manual_seed(seed)
    n = 3000
    batches = []
    for _ in range(5):  # several merges on top of each other, with ids of no channel (-1)
        count = int(torch.randint(1, 4000, (1,), generator=gen))
        a = torch.randint(-1, n, (count,), generator=gen)
        b = torch.randint(-1, n, (count,), generator=gen)
        batches.append((a, b))
    one, many = Tracer(), Tracer()
    one.new_ids(n)
    many.new_ids(n)
    monkeypatch.setattr(trace, "_MERGE_AT_ONCE", 10**9)
    for a, b in batches:
        one.merge(a, b)
    monkeypatch.setattr(trace, "_MERGE_AT_ONCE", 0)
    for a, b in batches:
        many.merge(a, b)
    assert _roots(many) == _roots(one)
    assert len(set(_roots(one))) < n  # the pairs did join sets


def test_a_chain_joins_into_its_smallest_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "_MERGE_AT_ONCE", 0)
    tracer = Tracer()
    tracer.new_ids(10)
    tracer.merge(torch.tensor([9, 8, 7, 2]), torch.tensor([8, 7, 6, 3]))  # 6-9 and 2-3
    tracer.merge(torch.tensor([6]), torch.tensor([3]))
    assert _roots(tracer) == [0, 1, 2, 2, 4, 5, 2, 2, 2, 2]
