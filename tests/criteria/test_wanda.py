import torch

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
