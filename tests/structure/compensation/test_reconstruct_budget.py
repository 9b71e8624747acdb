"""reconstruct_blocks' cost: each block runs once per batch outside its steps, a budget of CPU
time spread evenly over the blocks, and a model compacted before it (hidden width kept)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit as prune
from prunekit.structure import reconstruct_blocks


class _Clock:
    """reconstruct_blocks' CPU clock, made up: each call of a block's forward takes
    `cost` CPU seconds (a power of two: the sums are exact), nothing else any."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.cost = 0.25

    def process_time(self) -> float:
        return self.cpu


class _Block(nn.Module):
    def __init__(self, width: int, clock: _Clock) -> None:
        super().__init__()
        self.up = nn.Linear(width, 3 * width)
        self.down = nn.Linear(3 * width, width)
        self.clock = clock
        self.runs = 0

    def forward(self, x: Tensor) -> Tensor:
        self.runs += 1
        self.clock.cpu += self.clock.cost
        out: Tensor = x + self.down(torch.relu(self.up(x)))
        return out


class _Net(nn.Module):
    def __init__(self, clock: _Clock, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Linear(4, 6)
        self.blocks = nn.ModuleList(_Block(6, clock) for _ in range(blocks))
        self.head = nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        out: Tensor = self.head(x)
        return out


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    import prunekit.structure.compensation.reconstruct as reconstruct

    made_up = _Clock()
    monkeypatch.setattr(reconstruct, "time", made_up)
    return made_up


def _pruned(clock: _Clock) -> tuple[_Net, _Net, list[Tensor]]:
    torch.manual_seed(0)
    model = _Net(clock).eval()
    reference = copy.deepcopy(model)
    batches = [torch.randn(5, 4) for _ in range(3)]
    prune.prune_channels(model, batches[0], 0.5, exclude=["stem"])
    for net in (model, reference):
        for block in net.blocks:
            assert isinstance(block, _Block)
            block.runs, block.clock = 0, clock  # the copy's blocks on the same clock
    clock.cpu = 0.0
    return model, reference, batches


def _runs(net: _Net) -> list[int]:
    return [block.runs for block in net.blocks if isinstance(block, _Block)]


def test_each_block_of_either_model_runs_once_per_batch_beside_its_steps(clock: _Clock) -> None:
    """The reference's outputs are both the targets and its next block's inputs; the
    model's pass after the steps gives both its error and its next block's inputs."""
    model, reference, batches = _pruned(clock)
    errors = reconstruct_blocks(model, reference, batches, steps=4, lr=1e-2)
    assert _runs(reference) == [3, 3, 3]
    assert _runs(model) == [3 + 4 + 3] * 3  # error before, steps, error after
    assert all(after < first for first, after in errors)


def test_a_cpu_budget_is_spread_evenly_over_the_blocks_and_kept(clock: _Clock) -> None:
    """With 0.25 s a block call and 3 batches, a block's passes (targets, error before and
    after) take 2.25 s: of 12 s, 6.75 go to passes and 5.25 to steps, 1.75 s (7 steps) a
    block, the whole call's CPU time exactly the budget."""
    model, reference, batches = _pruned(clock)
    errors = reconstruct_blocks(model, reference, batches, steps=1000, lr=1e-2, cpu_seconds=12.0)
    assert _runs(model) == [3 + 7 + 3] * 3
    assert clock.cpu == 12.0
    assert all(after < first for first, after in errors)


def test_with_a_budget_steps_still_caps_each_block(clock: _Clock) -> None:
    model, reference, batches = _pruned(clock)
    reconstruct_blocks(model, reference, batches, steps=2, lr=1e-2, cpu_seconds=100.0)
    assert _runs(model) == [3 + 2 + 3] * 3


def test_a_budget_used_up_by_the_passes_takes_no_step_and_changes_nothing(clock: _Clock) -> None:
    model, reference, batches = _pruned(clock)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    errors = reconstruct_blocks(model, reference, batches, steps=50, cpu_seconds=1.0)
    assert _runs(model) == [3 + 0 + 3] * 3
    assert all(after == first for first, after in errors)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_the_rate_follows_the_share_of_the_budget_used(
    clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """7 steps of a 1.75 s share: the cosine at 0, 1/7, ..., 6/7 of it, as over 7 steps."""
    rates: list[float] = []
    step = torch.optim.Adam.step

    def noted(self: torch.optim.Adam, *args: Any, **kwargs: Any) -> Any:
        rates.append(self.param_groups[0]["lr"])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", noted)
    model, reference, batches = _pruned(clock)
    reconstruct_blocks(model, reference, batches, steps=1000, lr=0.01, cpu_seconds=12.0)
    expected = [0.01 * 0.5 * (1 + math.cos(math.pi * k / 7)) for k in range(7)]
    assert rates == pytest.approx(expected * 3)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0.0, ValueError, "invalid cpu_seconds=0.0; expected a finite float > 0"),
        (-1, ValueError, "invalid cpu_seconds=-1; expected a finite float > 0"),
        (math.nan, ValueError, "invalid cpu_seconds=nan; expected"),
        (math.inf, ValueError, "invalid cpu_seconds=inf; expected"),
        (True, TypeError, "invalid cpu_seconds=True of type bool; expected a finite float"),
        ("60", TypeError, "invalid cpu_seconds='60' of type str; expected a finite float"),
    ],
)
def test_a_bad_budget_is_refused_and_the_model_left(
    clock: _Clock, value: object, error: type, message: str
) -> None:
    model, reference, batches = _pruned(clock)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=f"reconstruct_blocks: {message}"):
        reconstruct_blocks(model, reference, batches, cpu_seconds=value)  # type: ignore[arg-type]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert _runs(model) == [0, 0, 0]


def _llama() -> tuple[nn.Module, list[dict[str, Tensor]]]:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=48)  # fmt: skip
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, 100, (2, 10), generator=g)} for _ in range(3)]
    return transformers.LlamaForCausalLM(config).eval(), batches


def test_a_model_compacted_with_its_hidden_width_kept_trains_as_the_masked_one() -> None:
    """MLP widths and heads cut, the hidden width kept: the compacted model's blocks take the
    reference's shapes, and their steps are the masked model's (a masked entry's gradient
    is zero, so Adam leaves it), so both end computing the same."""
    reference, batches = _llama()
    masked = copy.deepcopy(reference)
    prune.prune_channels(masked, batches[0], 0.5, heads=0.5)
    compacted = copy.deepcopy(masked)
    prune.compact(compacted, batches[0], latency_runs=0)
    up = compacted.get_submodule("model.layers.0.mlp.up_proj")
    assert isinstance(up, nn.Linear) and up.out_features == 24
    first = reconstruct_blocks(masked, reference, batches, steps=12, lr=2e-3)
    second = reconstruct_blocks(compacted, reference, batches, steps=12, lr=2e-3)
    assert all(after < 0.5 * before for before, after in second)
    assert [a for _, a in second] == pytest.approx([a for _, a in first], rel=1e-3)
    prune.compact(masked, batches[0], latency_runs=0)
    with torch.no_grad():
        for batch in batches:
            torch.testing.assert_close(
                compacted(**batch).logits, masked(**batch).logits, atol=1e-4, rtol=1e-4
            )
