"""The refusals of block-by-block calibration (calibrate.block_inputs) name the entry point
calibrating, as its other errors do, and hint sequential=False only to the callers that
have that option (prune_model), not to prune_channels, reconstruct_blocks or the streamed
calls, which have none."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from prunekit import calibrate as cal
from prunekit.calibrate.block_inputs import SEQUENTIAL


class Stack(nn.Module):
    def __init__(self, blocks: list[nn.Module], order: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(blocks)
        self.order = order

    def forward(self, x: Tensor) -> Tensor:
        for i in self.order:
            x = self.layers[i](x)
        return x


class Pair(nn.Module):
    """A block returning a dict: no hidden states the next block can be given."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        return {"x": self.fc(x)}


@pytest.mark.parametrize("hint", ["", SEQUENTIAL])
def test_a_block_called_out_of_turn_names_the_owner(hint: str) -> None:
    model = Stack([nn.Linear(4, 4) for _ in range(3)], (0, 2, 1))
    with pytest.raises(ValueError) as raised:
        cal.block_calls(model, model.layers, [torch.randn(2, 4)], owner="mine", hint=hint)
    told = str(raised.value)
    assert told.startswith("mine: calibration: the model's forward calls block 2 before block 1")
    assert told.endswith("expected a forward that calls them so" + hint)


@pytest.mark.parametrize("hint", ["", SEQUENTIAL])
def test_one_block_at_two_places_names_the_owner(hint: str) -> None:
    """One pass refuses such a block too: no hint of sequential=False, even where asked."""
    block = nn.Linear(4, 4)
    model = Stack([block, block], (0, 1))
    with pytest.raises(ValueError) as raised:
        cal.block_calls(model, model.layers, [torch.randn(2, 4)], owner="mine", hint=hint)
    told = str(raised.value)
    assert told.startswith("mine: calibration: the model's blocks hold one Linear at positions")
    assert told.endswith("give each use its own module")


@pytest.mark.parametrize("hint", ["", SEQUENTIAL])
def test_a_block_without_hidden_states_hints_only_as_asked(hint: str) -> None:
    inputs: list[cal.Inputs] = [((torch.randn(2, 4),), {})]
    with pytest.raises(ValueError) as raised:
        cal.next_inputs(Pair(), inputs, owner="mine", hint=hint)
    told = str(raised.value)
    assert told.startswith("mine: calibration: Pair returned a dict")
    assert ("sequential=False" in told) == bool(hint)
    with pytest.raises(ValueError) as raised:
        cal.run_block(Pair(), inputs[0], "mine", hint=hint)
    assert str(raised.value).startswith("mine: calibration: Pair returned a dict")
    assert str(raised.value).endswith(")" + hint if hint else "starting with one)")
