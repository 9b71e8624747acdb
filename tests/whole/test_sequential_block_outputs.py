"""Sequential calibration hands each block's output to the next block: a block whose output
is no tensor (nor a tuple or list starting with one) is named as the cause, not the batch,
and the model is left as it was."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        return {"h": self.fc(x)}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)["h"]
        out: Tensor = self.head(x)
        return out


BATCHES = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(2)]


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_block_that_returns_a_dict_is_named(method: str) -> None:
    model = Net()
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"^prune_model: calibration: Block returned a dict, "
                       r"whose hidden states the next block cannot be given; expected a tensor "
                       r"\(or a tuple or list starting with one\).*sequential=False"):  # fmt: skip
        prunekit.prune_model(model, 0.5, method=method, calibration=BATCHES, sequential=True)
    assert fingerprint(model) == before


def test_the_same_model_prunes_whole() -> None:
    model = Net()
    prunekit.prune_model(model, 0.5, method="wanda", calibration=BATCHES, sequential=False)
    assert float((model.blocks[0].fc.weight == 0).float().mean()) == 0.5
