from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune


def test_wanda_ranks_float64_norms_by_the_exact_product() -> None:
    # |w| x norm differ by 2^-30 here: in float32 the two scores tie and the lower
    # column would go; ranked by the exact product, the smaller one goes.
    norms = torch.tensor([1.0 + 2.0**-30, 1.0], dtype=torch.float64)
    w = torch.tensor([[1.0, 1.0]])
    scores = prune.Wanda(norms).scores(w)
    assert scores.dtype == torch.float64
    assert scores.tolist() == [[1.0 + 2.0**-30, 1.0]]
    got = prune.Pruning(0.5, prune.Wanda(norms), prune.PerRow()).prune(w)
    assert got.tolist() == [[1.0, 0.0]]


def test_wanda_scores_keep_the_weights_dtype_for_float32_norms() -> None:
    scores = prune.Wanda(torch.tensor([2.0, 0.5])).scores(torch.tensor([[1.0, -3.0]]))
    assert scores.dtype == torch.float32
    assert scores.tolist() == [[2.0, 1.5]]


def test_wanda_scores_broadcast_and_promote_as_the_product_does() -> None:
    from prunekit.criteria.wanda import wanda_scores

    torch.manual_seed(0)
    cases = [
        (torch.randn(3, 4), torch.rand(1, 4, dtype=torch.float64)),
        (torch.randn(3, 4, dtype=torch.float16), torch.rand(4)),
        (torch.randn(2, 4, 3, 3).bfloat16(), torch.rand(1, 4, 1, 1, dtype=torch.float64)),
        (torch.randn(4), torch.rand(3, 4)),  # norms wider than the values
        (torch.tensor([[float("nan"), -0.0, float("-inf")]]), torch.tensor([1.0, 2.0, 3.0])),
    ]
    for values, norms in cases:
        wide = torch.promote_types(values.dtype, norms.dtype)
        before = values.clone()
        expected = values.abs().to(wide) * norms.to(wide)
        got = wanda_scores(values, norms)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got.isnan(), expected.isnan())
        assert torch.equal(got.nan_to_num(), expected.nan_to_num())
        assert torch.equal(values.nan_to_num(), before.nan_to_num())  # values untouched


@pytest.mark.parametrize("norms", [[1.0, 2.0], 3.0, {"fc": [1.0, 2.0]}])
def test_wanda_refuses_norms_that_are_not_tensors(norms: Any) -> None:
    with pytest.raises(TypeError, match=r"Wanda: invalid norms .*of type (list|float); expected"):
        prune.Wanda(norms)


def test_wanda_refuses_negative_norms_naming_the_first() -> None:
    layer = nn.Linear(4, 2)
    before = layer.weight.detach().clone()
    wanda = prune.Wanda(torch.tensor([0.5, -4.0, 1.0, -1.0]))
    words = r"Wanda: the input norms hold 2 negative value\(s\), e\.g\. -4\.0 at index \(1,\)"
    with pytest.raises(ValueError, match=words):
        prune.Pruning.apply(layer, "weight", 0.25, criterion=wanda, pattern=prune.PerRow())
    assert not prune.is_pruned(layer)
    assert torch.equal(layer.weight, before)
