"""reconstruct_blocks: each block of a pruned model trained towards the reference's block."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn

import prunekit as prune
from prunekit.structure import reconstruct_blocks


class _Block(nn.Module):
    """An inverted residual: expansion, BatchNorm, depthwise, projection, residual add."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.expand = nn.Conv2d(width, hidden, 1)
        self.norm = nn.BatchNorm2d(hidden)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.project = nn.Conv2d(hidden, width, 1)
        self.fail = False

    def forward(self, x: Tensor, scale: float = 1.0) -> Tensor:
        if self.fail:
            raise RuntimeError("this block fails")
        y = torch.relu(self.depthwise(torch.relu(self.norm(self.expand(x)))))
        return x + scale * self.project(y)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList(_Block(8, 24) for _ in range(3))
        self.head = nn.Linear(8, 5)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x, scale=0.5)
        return self.head(x.mean((2, 3)))


def _pruned() -> tuple[_Net, _Net, list[Tensor]]:
    torch.manual_seed(0)
    model = _Net()
    for block in model.blocks:  # statistics that are not the identity
        norm = block.norm
        assert isinstance(norm, nn.BatchNorm2d)
        norm.running_mean.uniform_(-0.2, 0.2)
        norm.running_var.uniform_(0.5, 2.0)
    model.eval()
    reference = copy.deepcopy(model)
    batches = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    prune.prune_channels(model, batches[0], 0.5, exclude=["stem"])
    return model, reference, batches


def _error(model: nn.Module, reference: nn.Module, batches: list[Tensor]) -> float:
    with torch.no_grad():
        return sum(float((model(b) - reference(b)).square().sum()) for b in batches)


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_each_block_gets_closer_to_the_reference_and_the_output_follows() -> None:
    model, reference, batches = _pruned()
    before = _error(model, reference, batches)
    dense = _state(reference)
    errors = reconstruct_blocks(model, reference, batches, steps=40, lr=1e-2)
    assert len(errors) == 3
    assert all(after <= first for first, after in errors)
    assert errors[0][1] < 0.5 * errors[0][0]
    assert _error(model, reference, batches) < 0.5 * before
    after = reference.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in dense.items())  # reference unchanged
    assert not any(m.training for m in model.modules())


def test_masked_weights_stay_zero_and_the_model_compacts_to_the_same_output() -> None:
    model, reference, batches = _pruned()
    reconstruct_blocks(model, reference, batches, steps=30, lr=1e-2)
    with torch.no_grad():
        masked = model(batches[0])
    prune.compact(model, batches[0])
    expand = model.blocks[0].expand
    assert isinstance(expand, nn.Conv2d)
    assert expand.out_channels == 12  # half of 24 left: the masked half stayed out
    with torch.no_grad():
        torch.testing.assert_close(model(batches[0]), masked, atol=1e-5, rtol=1e-5)


def test_a_block_that_does_not_improve_is_put_back() -> None:
    model, reference, batches = _pruned()
    before = _state(model)
    errors = reconstruct_blocks(model, reference, batches, steps=5, lr=1e4)
    assert all(after == first for first, after in errors)
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())


def test_training_flags_are_restored() -> None:
    model, reference, batches = _pruned()
    model.train()
    reconstruct_blocks(model, reference, batches, steps=2)
    assert all(m.training for m in model.modules())
    assert not any(m.training for m in reference.modules())


def test_an_error_midway_leaves_the_model_as_it_was() -> None:
    model, reference, batches = _pruned()
    block = reference.blocks[2]
    assert isinstance(block, _Block)
    block.fail = True  # first called for its targets, once the model's first two have trained
    before = _state(model)
    with pytest.raises(RuntimeError, match="this block fails"):
        reconstruct_blocks(model, reference, batches, steps=20, lr=1e-2)
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "invalid steps=0"),
        ({"steps": True}, "invalid steps=True"),
        ({"steps": 2.0}, "invalid steps=2.0"),
        ({"lr": 0.0}, "invalid lr=0.0"),
        ({"lr": math.nan}, "invalid lr=nan"),
        ({"lr": math.inf}, "invalid lr=inf"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, float], message: str) -> None:
    model, reference, batches = _pruned()
    before = _state(model)
    with pytest.raises(ValueError, match=f"reconstruct_blocks: {message}"):
        reconstruct_blocks(model, reference, batches, **kwargs)  # type: ignore[arg-type]
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())


def test_models_without_the_same_blocks_are_refused() -> None:
    model, reference, batches = _pruned()
    with pytest.raises(ValueError, match="reconstruct_blocks: the model's blocks are 'blocks'"):
        reconstruct_blocks(model, nn.Sequential(nn.Linear(2, 2)), batches)
    with pytest.raises(ValueError, match="reconstruct_blocks: Sequential holds no sequence"):
        reconstruct_blocks(nn.Sequential(nn.Linear(2, 2)), reference, batches)
    with pytest.raises(TypeError, match="reconstruct_blocks: model="):
        reconstruct_blocks("model", reference, batches)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reconstruct_blocks: calibration holds no batch"):
        reconstruct_blocks(model, reference, [])
