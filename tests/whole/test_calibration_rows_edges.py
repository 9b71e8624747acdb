"""prune_model's calibrated methods refuse calibration in which no batch holds a row: every
batch empty, or every attention_mask all zero. 'taylor' pruned on gradients of zero (every
score tied, so the first entries of each tensor went) without a word; 'wanda' and
'sparsegpt' said the layers "never ran", which they did."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit as prune
from prunekit.core.errors import is_explained

X = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


def _summed(out: Tensor, batch: Any) -> Tensor:
    return out.sum()


METHODS: list[tuple[str, dict[str, Any]]] = [
    ("taylor", {"loss": _summed}),
    ("wanda", {}),
    ("sparsegpt", {}),
]


@pytest.mark.parametrize(("method", "options"), METHODS)
@pytest.mark.parametrize("count", [1, 2])
def test_only_empty_batches_are_refused_and_nothing_changes(
    method: str, options: dict[str, Any], count: int
) -> None:
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError) as raised:
        prune.prune_model(model, 0.5, method=method, calibration=[X[:0]] * count, **options)
    text = str(raised.value)
    wanted = (f"prune_model: every one of the {count} calibration batches is empty, so "
              f"method={method!r} has no row to calibrate on; expected")  # fmt: skip
    assert text.startswith(wanted), text
    assert is_explained(raised.value)
    assert not prune.is_pruned(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_an_empty_batch_among_real_ones_is_fine() -> None:
    model = _model()
    prune.prune_model(model, 0.5, method="taylor", calibration=[X[:0], X], loss=_summed)
    mask = model[0].get_buffer("weight_mask")
    assert float((mask == 0).float().mean()) == 0.5
