"""reconstruct_blocks: each block of a pruned model trained towards the reference's block."""

from __future__ import annotations

import copy
import math
from collections import UserDict
from typing import Any

import numpy
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
        self.runs = 0  # calls of its forward itself

    def forward(self, x: Tensor, scale: float = 1.0) -> Tensor:
        self.runs += 1
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


@pytest.mark.parametrize("whose", ["reference", "model"])
def test_an_error_midway_leaves_the_model_as_it_was(whose: str) -> None:
    """Block 2 of the reference is first called for its targets, block 1 of the model in its
    training, once the blocks before have trained; either's error is named as the model's
    on the batch (the model's was torch's bare RuntimeError)."""
    model, reference, batches = _pruned()
    block = reference.blocks[2] if whose == "reference" else model.blocks[1]
    assert isinstance(block, _Block)
    block.fail = True
    before = _state(model)
    with pytest.raises(ValueError, match=r"^reconstruct_blocks: calibration: the model cannot "
                       r"take batch 0: RuntimeError: this block fails") as caught:  # fmt: skip
        reconstruct_blocks(model, reference, batches, steps=20, lr=1e-2)
    assert isinstance(caught.value.__cause__, RuntimeError)  # named as the model's, as it is
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"steps": 0}, ValueError, "invalid steps=0; expected an int >= 1"),
        ({"steps": True}, TypeError, "invalid steps=True of type bool; expected an int"),
        ({"steps": 2.0}, TypeError, "invalid steps=2.0 of type float; expected an int"),
        ({"steps": "3"}, TypeError, "invalid steps='3' of type str; expected an int"),
        ({"steps": None}, TypeError, "invalid steps=None of type NoneType; expected an int"),
        ({"lr": 0.0}, ValueError, "invalid lr=0.0; expected a finite float > 0"),
        ({"lr": -1}, ValueError, "invalid lr=-1; expected a finite float > 0"),
        ({"lr": math.nan}, ValueError, "invalid lr=nan; expected"),
        ({"lr": math.inf}, ValueError, "invalid lr=inf; expected"),
        ({"lr": True}, TypeError, "invalid lr=True of type bool; expected a finite float"),
        ({"lr": "0.1"}, TypeError, "invalid lr='0.1' of type str; expected a finite float"),
        ({"lr": torch.tensor(0.1)}, TypeError, r"invalid lr=tensor\(0.1000\) of type Tensor"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], error: type, message: str) -> None:
    """A wrong type is a TypeError (a bool is no int or number here), a bad value of the
    right type a ValueError; the model is left as it was."""
    model, reference, batches = _pruned()
    before = _state(model)
    with pytest.raises(error, match=f"reconstruct_blocks: {message}"):
        reconstruct_blocks(model, reference, batches, **kwargs)
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())


def test_steps_and_lr_of_other_number_types_are_taken() -> None:
    model, reference, batches = _pruned()
    errors = reconstruct_blocks(
        model, reference, batches, steps=numpy.int64(2), lr=numpy.float32(1e-3)
    )
    assert len(errors) == 3


def test_a_reference_or_calibration_of_a_wrong_type_is_refused_by_name() -> None:
    model, reference, batches = _pruned()
    before = _state(model)
    with pytest.raises(TypeError, match="reconstruct_blocks: reference='ref' is no torch"):
        reconstruct_blocks(model, "ref", batches)  # type: ignore[arg-type]
    one = UserDict({"x": batches[0]})  # one batch of keyword arguments, as a tokenizer's
    with pytest.raises(TypeError, match="reconstruct_blocks: invalid calibration of type User"):
        reconstruct_blocks(model, reference, one)
    with pytest.raises(TypeError, match="reconstruct_blocks: invalid calibration of type str"):
        reconstruct_blocks(model, reference, "batches")
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


def _pruned_with_stem() -> tuple[_Net, _Net, list[Tensor]]:
    """The net with half of every group pruned, the stem's and residual width included."""
    torch.manual_seed(0)
    model = _Net().eval()
    reference = copy.deepcopy(model)
    batches = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    prune.prune_channels(model, batches[0], 0.5)
    return model, reference, batches


def test_ends_train_the_stem_with_the_first_block_and_the_head_towards_the_output() -> None:
    model, reference, batches = _pruned_with_stem()
    alone = copy.deepcopy(model)
    stem, head = _state(model.stem), _state(model.head)
    first = reconstruct_blocks(alone, reference, batches, steps=40, lr=1e-2)
    errors = reconstruct_blocks(model, reference, batches, steps=40, lr=1e-2, ends=True)
    assert len(errors) == 4  # three blocks, then the output
    assert errors[0][1] < first[0][1]  # the stem's channels help the first block
    assert not all(torch.equal(v, model.stem.state_dict()[k]) for k, v in stem.items())
    assert not all(torch.equal(v, model.head.state_dict()[k]) for k, v in head.items())
    with torch.no_grad():
        scale = sum(float(reference(b).double().square().sum()) for b in batches)
        real = sum(float((model(b) - reference(b)).double().square().sum()) for b in batches)
    assert errors[-1][1] < errors[-1][0]
    assert errors[-1][1] == pytest.approx(real / scale, rel=1e-4)  # the error it reports
    assert _error(model, reference, batches) < _error(alone, reference, batches)
    with torch.no_grad():
        masked = model(batches[0])
    prune.compact(model, batches[0])
    with torch.no_grad():
        torch.testing.assert_close(model(batches[0]), masked, atol=1e-5, rtol=1e-5)
    assert all("forward" not in block.__dict__ for block in model.blocks)


def test_ends_leave_the_stem_and_head_alone_without_it() -> None:
    model, reference, batches = _pruned_with_stem()
    stem, head = _state(model.stem), _state(model.head)
    reconstruct_blocks(model, reference, batches, steps=10, lr=1e-2)
    assert all(torch.equal(v, model.stem.state_dict()[k]) for k, v in stem.items())
    assert all(torch.equal(v, model.head.state_dict()[k]) for k, v in head.items())


class _Mapped(_Net):
    """The net with its output in a mapping."""

    def forward(self, x: Tensor) -> dict[str, Tensor]:  # type: ignore[override]
        x = self.stem(x)
        for block in self.blocks:
            x = block(x, scale=0.5)
        return {"logits": self.head(x.mean((2, 3)))}


class _Dense(_Net):
    """The head reads every block's output: a forward that needs the blocks themselves."""

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        total = torch.zeros_like(x)
        for block in self.blocks:
            x = block(x, scale=0.5)
            total = total + x
        return self.head(total.mean((2, 3)))


def _calls(net: type[_Net], ends: bool) -> tuple[int, list[tuple[float, float]], float]:
    """The blocks' forwards run by reconstruct_blocks on a pruned `net`, its errors, and the
    output error measured after by whole forwards over the reference's output squares."""
    torch.manual_seed(0)
    model = net().eval()
    reference = copy.deepcopy(model)
    batches = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    prune.prune_channels(model, batches[0], 0.5)
    errors = reconstruct_blocks(model, reference, batches, steps=10, lr=1e-3, ends=ends)
    calls = sum(block.runs for block in model.blocks if isinstance(block, _Block))

    def out(m: nn.Module, b: Tensor) -> Tensor:
        found = m(b)
        return found["logits"] if isinstance(found, dict) else found

    with torch.no_grad():
        real = sum(float((out(model, b) - out(reference, b)).double().square().sum())
                   for b in batches)  # fmt: skip
        scale = sum(float(out(reference, b).double().square().sum()) for b in batches)
    return calls, errors, real / scale


def test_the_heads_steps_skip_the_blocks_when_that_gives_the_same_output() -> None:
    without, _, _ = _calls(_Mapped, ends=False)
    calls, errors, real = _calls(_Mapped, ends=True)
    # only the forward finding the ends and the three keeping the last block's outputs
    # run the blocks: the head's 10 steps and its two error passes over 3 batches do not
    assert calls - without == 3 + 3 * 3
    assert errors[-1][1] < errors[-1][0]
    assert errors[-1][1] == pytest.approx(real, rel=1e-4)


def test_a_forward_that_needs_the_blocks_runs_whole_for_the_head() -> None:
    without, _, _ = _calls(_Dense, ends=False)
    calls, errors, real = _calls(_Dense, ends=True)
    assert calls - without >= 3 * 10  # every head step ran the three blocks
    assert errors[-1][1] < errors[-1][0]
    assert errors[-1][1] == pytest.approx(real, rel=1e-4)


class _Tied(nn.Module):
    """A stem Linear whose weight the output Linear shares (tied), on (batch, tokens, 6)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 6, bias=False)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6))
                                    for _ in range(2))  # fmt: skip
        self.norm = nn.LayerNorm(6)
        self.out = nn.Linear(6, 6, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x: Tensor) -> Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.out(self.norm(x))


def test_a_parameter_used_before_and_after_the_blocks_is_left() -> None:
    torch.manual_seed(0)
    model = _Tied().eval()
    reference = copy.deepcopy(model)
    batches = [torch.randn(2, 5, 6) for _ in range(3)]
    prune.prune_channels(model, batches[0], 0.5)
    embed = model.embed.weight.detach().clone()
    norm = _state(model.norm)
    errors = reconstruct_blocks(model, reference, batches, steps=20, lr=1e-2, ends=True)
    assert len(errors) == 3
    assert torch.equal(model.embed.weight, embed)
    assert not all(torch.equal(v, model.norm.state_dict()[k]) for k, v in norm.items())


class _TiedAndStem(_Tied):
    """The tied net with a stem Linear of its own after the shared one."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = nn.Linear(6, 6)

    def forward(self, x: Tensor) -> Tensor:
        x = self.shift(self.embed(x))
        for block in self.blocks:
            x = x + block(x)
        return self.out(self.norm(x))


def test_the_stems_steps_leave_no_gradient_on_a_parameter_they_do_not_train() -> None:
    torch.manual_seed(0)
    model = _TiedAndStem().eval()
    reference = copy.deepcopy(model)
    batches = [torch.randn(2, 5, 6) for _ in range(3)]
    prune.prune_channels(model, batches[0], 0.5)
    shift = _state(model.shift)
    reconstruct_blocks(model, reference, batches, steps=5, lr=1e-2, ends=True)
    assert not all(torch.equal(v, model.shift.state_dict()[k]) for k, v in shift.items())
    assert model.embed.weight.grad is None
    assert all(p.grad is None for p in model.parameters())


def test_a_failure_in_the_heads_steps_leaves_the_model_as_it_was() -> None:
    model, reference, batches = _pruned_with_stem()
    before = _state(model)
    calls = []

    def fail(*_: object) -> None:
        calls.append(1)
        # after the forward finding the ends, the three kept outputs, the check of the
        # replayed blocks and the error before: the head's first step
        if len(calls) > 1 + 3 + 1 + 3:
            raise RuntimeError("the head fails")

    model.head.register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="the head fails"):
        reconstruct_blocks(model, reference, batches, steps=5, lr=1e-2, ends=True)
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
    assert all("forward" not in block.__dict__ for block in model.blocks)
    assert all(p.requires_grad for p in model.parameters())


def test_ends_that_is_no_bool_is_refused() -> None:
    model, reference, batches = _pruned()
    before = _state(model)
    with pytest.raises(TypeError, match="reconstruct_blocks: invalid ends=1; expected True or"):
        reconstruct_blocks(model, reference, batches, ends=1)  # type: ignore[arg-type]
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())


def test_a_gpt2_whose_blocks_take_their_cache_by_position_is_reconstructed() -> None:
    """GPT-2 hands its key/value cache to each block as a positional argument: every step
    runs the block afresh (more steps than batches, so batches come back), and the error
    returned for the last block is what the two models' forwards give."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=32)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 64, (2, 12), generator=g) for _ in range(2)]
    prune.prune_channels(model, batches[0], 0.5, heads=0.5)
    errors = reconstruct_blocks(model, reference, batches, steps=5)
    assert all(after < 0.6 * first for first, after in errors)

    def last_block(net: nn.Module) -> list[Tensor]:
        found: list[Tensor] = []
        block = net.transformer.h[-1]
        handle = block.register_forward_hook(
            lambda m, a, out: found.append(out[0] if isinstance(out, tuple) else out)
        )
        with torch.no_grad():
            for batch in batches:
                net(batch)
        handle.remove()
        return found

    ours, theirs = last_block(model), last_block(reference)
    real = sum(float((o - t).double().square().sum()) for o, t in zip(ours, theirs, strict=True))
    scale = sum(float(t.double().square().sum()) for t in theirs)
    assert errors[-1][1] == pytest.approx(real / scale, rel=1e-4)


def test_a_model_compacted_to_a_narrower_hidden_width_is_refused_clearly() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=48)  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    model = copy.deepcopy(reference)
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    prune.prune_channels(model, {"input_ids": ids}, hidden=0.25)
    prune.compact(model, {"input_ids": ids}, latency_runs=0)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"reconstruct_blocks: the model's first block takes "
                       r"hidden states of shape \(2, 8, 24\) but the reference's takes "
                       r"\(2, 8, 32\).*takes the masked model before compaction"):  # fmt: skip
        reconstruct_blocks(model, reference, [ids], steps=2)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))
