"""The channel tracer's union-find: merging many pairs at once (with tensor operations) gives
the sets and roots that merging them one by one with a plain union-find gives (a root is the
smallest id of its set)."""

from __future__ import annotations

import pytest
import torch

from prunekit.structure.trace.tracer import Tracer


def _roots(tracer: Tracer) -> list[int]:
    return [tracer.find(i) for i in range(len(tracer.parent))]


def _one_by_one(n: int, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    """A plain union-find: each pair joins its two sets under the smaller root."""
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for a, b in batches:
        for x, y in zip(a.tolist(), b.tolist(), strict=True):
            if x >= 0 and y >= 0:
                rx, ry = find(x), find(y)
                parent[max(rx, ry)] = min(rx, ry)
    return [find(i) for i in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_merging_many_pairs_at_once_equals_one_by_one(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    n = 3000
    batches = []
    for _ in range(5):  # several merges on top of each other, with ids of no channel (-1)
        count = int(torch.randint(1, 4000, (1,), generator=gen))
        a = torch.randint(-1, n, (count,), generator=gen)
        b = torch.randint(-1, n, (count,), generator=gen)
        batches.append((a, b))
    many = Tracer()
    many.new_ids(n)
    for a, b in batches:
        many.merge(a, b)
    expected = _one_by_one(n, batches)
    assert _roots(many) == expected
    assert len(set(expected)) < n  # the pairs did join sets


def test_a_chain_joins_into_its_smallest_id() -> None:
    tracer = Tracer()
    tracer.new_ids(10)
    tracer.merge(torch.tensor([9, 8, 7, 2]), torch.tensor([8, 7, 6, 3]))  # 6-9 and 2-3
    tracer.merge(torch.tensor([6]), torch.tensor([3]))
    assert _roots(tracer) == [0, 1, 2, 2, 4, 5, 2, 2, 2, 2]


def test_ids_made_after_merges_keep_the_sets() -> None:
    """New ids grow the union-find without touching the sets made so far."""
    tracer = Tracer()
    tracer.new_ids(3)
    tracer.merge(torch.tensor([2]), torch.tensor([0]))
    assert tracer.new_ids(2000).tolist() == list(range(3, 2003))
    tracer.merge(torch.tensor([2002]), torch.tensor([1]))
    assert _roots(tracer)[:3] == [0, 1, 0] and tracer.find(2002) == 1
    assert tracer.roots(torch.tensor([5, 2, 2002])).tolist() == [5, 0, 1]


@pytest.mark.parametrize("seed", range(3))
def test_a_union_of_two_vectors_equals_one_by_one(seed: int) -> None:
    """``union`` (one id per channel, pairs taken as they are) gives the sets of ``merge``."""
    gen = torch.Generator().manual_seed(seed)
    n = 500
    batches = [(torch.randint(-1, n, (300,), generator=gen),
                torch.randint(-1, n, (300,), generator=gen)) for _ in range(4)]  # fmt: skip
    tracer = Tracer()
    tracer.new_ids(n)
    for a, b in batches:
        tracer.union(a, b)
    assert _roots(tracer) == _one_by_one(n, batches)


@pytest.mark.parametrize("seed", range(3))
def test_fresh_ids_attached_join_their_partners_sets(seed: int) -> None:
    """``attach`` of ids made after every partner, each once, gives the sets of ``merge``."""
    gen = torch.Generator().manual_seed(seed)
    old = 400
    before = (torch.randint(-1, old, (600,), generator=gen),
              torch.randint(-1, old, (600,), generator=gen))  # fmt: skip
    tracer = Tracer()
    tracer.new_ids(old)
    tracer.merge(*before)
    partners = torch.randint(-1, old, (3, 50), generator=gen)  # a parameter's 150 elements
    fresh = tracer.new_ids(150).reshape(3, 50)
    tracer.attach(fresh, partners)
    assert _roots(tracer) == _one_by_one(old + 150, [before, (partners.flatten(), fresh.flatten())])
