"""reconstruct_blocks refuses what it cannot train, rather than return errors of NaN or leave
the model as it was without a word: the model given as its own reference, float16
parameters (Adam's squared gradients underflow), and batches on which a block's error is
not finite. Each refusal leaves the model as it was."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from prunekit.structure import reconstruct_blocks


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.down(torch.relu(self.up(x)))
        return out


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 6)
        self.blocks = nn.ModuleList(_Block(6) for _ in range(2))

    def forward(self, x: Tensor) -> Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return h


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    reference = _Net()
    model = copy.deepcopy(reference)
    with torch.no_grad():
        model.blocks[0].up.weight[:3] = 0
    return model, reference


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(model: nn.Module, before: dict[str, Tensor]) -> bool:
    return all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_model_as_its_own_reference_is_refused() -> None:
    model, _ = _pair()
    with pytest.raises(ValueError, match=r"reconstruct_blocks: .*reference.* is the model"):
        reconstruct_blocks(model, model, [torch.randn(5, 4)], steps=2)


def test_float16_parameters_are_refused() -> None:
    model, reference = _pair()
    model, reference = model.half(), reference.half()
    before = _state(model)
    with pytest.raises(ValueError, match=r"reconstruct_blocks: .*float16.*blocks\.0"):
        reconstruct_blocks(model, reference, [torch.randn(5, 4).half()], steps=2)
    assert _same(model, before)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_batches_giving_a_block_no_finite_error_are_refused(bad: float) -> None:
    model, reference = _pair()
    before = _state(model)
    batch = torch.randn(5, 4)
    batch[2, 1] = bad
    refused = r"reconstruct_blocks: the error of blocks\.0 .*not finite"
    with pytest.raises(ValueError, match=refused):
        reconstruct_blocks(model, reference, [torch.randn(5, 4), batch], steps=2)
    assert _same(model, before)


def test_finite_batches_still_train() -> None:
    model, reference = _pair()
    errors = reconstruct_blocks(model, reference, [torch.randn(5, 4) for _ in range(3)], steps=5)
    assert errors[0][1] < errors[0][0]
