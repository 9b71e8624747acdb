"""A Taylor saliency may be given signed (W x dL/dW accumulated without the absolute
value): the first-order change of the loss is its magnitude, and every pattern ranks it so,
as the saliency's absolute value."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import prunekit as prune
from prunekit.criteria.taylor import taylor_product

G = torch.Generator().manual_seed(0)
VALUES, SIGNED = torch.randn(8, 16, generator=G), torch.randn(8, 16, generator=G)
SIGNED[0, 0] = -10.0  # the largest change of the loss, signed negative


@pytest.mark.parametrize(
    "pattern", [None, prune.NM(2, 4), prune.PerRow(dim=0), prune.Channels(dim=0)]
)
def test_a_signed_saliency_ranks_as_its_magnitude(pattern: prune.Pattern | None) -> None:
    options = {} if pattern is None else {"pattern": pattern}
    signed = prune.Pruning(0.5, criterion=prune.Taylor(SIGNED), **options).prune(VALUES)
    absolute = prune.Pruning(0.5, criterion=prune.Taylor(SIGNED.abs()), **options).prune(VALUES)
    assert torch.equal(signed, absolute)
    assert signed[0, 0] == VALUES[0, 0] != 0  # the most negative product is kept


def test_the_largest_negative_product_is_kept_across_tensors() -> None:
    first, second = nn.Linear(2, 1, bias=False), nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        first.weight.copy_(torch.tensor([[1.0, 1.0]]))
        second.weight.copy_(torch.tensor([[1.0, 1.0]]))
    grads = torch.tensor([[-5.0, 0.1]]), torch.tensor([[0.2, 3.0]])
    saliency = {
        (first, "weight"): taylor_product(first.weight, grads[0]),
        (second, "weight"): taylor_product(second.weight, grads[1]),
    }
    masks = []
    for given in (saliency, {k: v.abs() for k, v in saliency.items()}):
        a, b = copy.deepcopy(first), copy.deepcopy(second)
        renamed = dict(zip([(a, "weight"), (b, "weight")], given.values(), strict=True))
        prune.global_unstructured([(a, "weight"), (b, "weight")], pruning_method=prune.Pruning,
                                  amount=2, criterion=prune.Taylor(renamed))  # fmt: skip
        masks.append((a.weight_mask.tolist(), b.weight_mask.tolist()))
    assert masks[0] == masks[1] == ([[1.0, 0.0]], [[0.0, 1.0]])
