"""A criterion ranked on calibration batches ('activation', 'taylor' with a loss of its own)
is refused when every batch is empty or masked out: it has no row to score on. It ranked
by 'l2' instead ('activation', its fallback for a layer that never ran), or on gradients of
zero (a loss such as a sum), and said nothing. A few empty batches among real ones add
nothing and are fine."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit as prune
from prunekit.core.errors import is_explained


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.c(torch.relu(self.b(torch.relu(self.a(x)))))
        return out


X = torch.randn(5, 6, generator=torch.Generator().manual_seed(0))


def _summed(out: Tensor, batch: Any) -> Tensor:
    return out.sum()


CRITERIA: list[tuple[str, dict[str, Any]]] = [
    ("activation", {}),
    ("taylor", {"loss": _summed}),
]


@pytest.mark.parametrize(("criterion", "options"), CRITERIA)
@pytest.mark.parametrize("count", [1, 3])
def test_calibration_of_empty_batches_only_is_refused(
    criterion: str, options: dict[str, Any], count: int
) -> None:
    torch.manual_seed(0)
    model = _Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError) as raised:
        prune.prune_channels(model, X, 0.5, criterion=criterion, calibration=[X[:0]] * count,
                             **options)  # fmt: skip
    text = str(raised.value)
    wanted = (f"prune_channels: every one of the {count} calibration batches is empty, so "
              f"criterion={criterion!r} has no row to score on")  # fmt: skip
    assert text.startswith(wanted), text
    assert "expected batches with at least one row" in text and is_explained(raised.value)
    assert not prune.is_pruned(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_masked_out_batches_only_are_refused_for_activation() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.zeros_like(ids)}
    with pytest.raises(ValueError, match=r"attention_mask that is all zero, so "
                                         r"criterion='activation' has no row"):  # fmt: skip
        prune.prune_channels(model, {"input_ids": ids}, 0.5, criterion="activation",
                             calibration=[batch])  # fmt: skip
    assert not prune.is_pruned(model)


def test_empty_batches_among_real_ones_add_nothing() -> None:
    torch.manual_seed(0)
    model = _Net()
    alone = [g.units for g in prune.prune_channels(model, X, 0.5, criterion="activation",
                                                   calibration=[X])]  # fmt: skip
    torch.manual_seed(0)
    model = _Net()
    mixed = prune.prune_channels(model, X, 0.5, criterion="activation", calibration=[X[:0], X])
    assert [g.units for g in mixed] == alone
