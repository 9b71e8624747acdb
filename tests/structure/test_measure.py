"""compact's latency: the masked and the compacted model timed alternately, the verdict
('faster', 'slower', 'no clear difference') from the pairs' ratios (a fake clock here), and
the config of a Hugging Face model put back with everything else when compaction fails."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint
from prunekit.structure.measure import (
    Paired,
    count_macs,
    latency_ms,
    macs_per_entry,
    paired_latency,
    perplexity,
)


class FakeClock:
    """Seconds that pass only in forward(): as long as the state switched to last costs."""

    def __init__(self, costs: dict[str, list[float]]) -> None:
        self.now = 0.0
        self.costs = {k: iter(v) for k, v in costs.items()}
        self.state = ""
        self.calls: list[str] = []

    def switch(self, state: str) -> Callable[[], None]:
        def run() -> None:
            self.state = state

        return run

    def forward(self) -> None:
        self.calls.append(self.state)
        self.now += next(self.costs[self.state])

    def __call__(self) -> float:
        return self.now


def timed(before: list[float], after: list[float]) -> tuple[Paired, list[str]]:
    clock = FakeClock({"before": before, "after": after})
    found = paired_latency(
        clock.switch("before"), clock.switch("after"), clock.forward, len(before) - 1, clock
    )
    return found, clock.calls


def test_runs_alternate_and_the_first_pair_warms_up() -> None:
    found, calls = timed([100.0, 0.004, 0.004, 0.004], [100.0, 0.002, 0.002, 0.002])
    assert calls == ["before", "after"] * 4
    assert found.pairs == 3
    assert found.before_ms == pytest.approx(4.0) and found.after_ms == pytest.approx(2.0)
    assert (found.ratio, found.low, found.high) == pytest.approx((2.0, 2.0, 2.0))


def test_verdict_says_faster_slower_or_no_clear_difference() -> None:
    faster, _ = timed([1.0, 0.004, 0.005, 0.004, 0.006], [1.0, 0.002, 0.002, 0.002, 0.003])
    assert faster.verdict() == "2.00x faster"
    slower, _ = timed([1.0, 0.002, 0.002, 0.002], [1.0, 0.003, 0.003, 0.003])
    assert slower.ratio == pytest.approx(2 / 3)
    assert slower.verdict() == "1.50x slower"
    assert "slower" in str(slower) and "faster" not in str(slower)
    # Half the pairs one way, half the other: the middle half of the ratios holds 1.
    mixed, _ = timed([1.0, 0.002, 0.004, 0.002, 0.004], [1.0, 0.003, 0.003, 0.003, 0.003])
    assert mixed.low < 1 < mixed.high
    assert mixed.verdict().startswith("no clear difference")
    # One pair: its ratio is the spread.
    single, _ = timed([1.0, 0.003], [1.0, 0.001])
    assert (single.low, single.high) == pytest.approx((3.0, 3.0))
    assert single.verdict() == "3.00x faster"


def test_a_nan_free_zero_time_does_not_divide_by_zero() -> None:
    found, _ = timed([1.0, 0.001, 0.001], [1.0, 0.0, 0.0])
    assert found.verdict().endswith("x faster") and found.ratio > 1


def test_a_clock_that_sees_no_time_in_either_state_finds_no_difference() -> None:
    found, _ = timed([1.0, 0.0, 0.0], [1.0, 0.0, 0.0])
    assert found.ratio == pytest.approx(1.0)
    assert str(found).startswith("0.00 ms -> 0.00 ms, no clear difference (1.00x)")
    slower, _ = timed([1.0, 0.0, 0.0], [1.0, 0.001, 0.001])
    assert 0 < slower.ratio < 1 and slower.verdict().endswith("x slower")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(self.drop(torch.relu(self.a(x))))


def test_compact_times_both_states_and_leaves_the_compacted_one() -> None:
    model, x = Net(), torch.randn(2, 3, 6, 6)
    prunekit.prune_channels(model, x, 0.5)
    model.train()
    seen: list[int] = []
    model.b.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    report = prunekit.compact(model, x, latency_runs=3)
    assert report.latency is not None and report.latency.pairs == 3
    assert report.latency_before_ms == report.latency.before_ms
    assert f"latency     {report.latency}" in str(report)
    # warm-up pair + 3 pairs, alternating: the masked model's 8 channels, the compacted 4
    timing = seen[-8:]
    assert timing == [8, 4] * 4
    assert model.a.out_channels == 4 and model.b.in_channels == 4
    assert model.training and model.drop.training  # the modes came back
    assert report.params_after == sum(p.numel() for p in model.parameters())
    untimed = prunekit.compact(Net(), x, latency_runs=0)
    assert untimed.latency is None and untimed.latency_before_ms is None
    assert "latency" not in str(untimed)


def test_a_failed_compaction_puts_the_config_back_too(monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=20, max_position_embeddings=8,
    )  # fmt: skip
    model = transformers.BertModel(config).eval()
    inputs = {"input_ids": torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(0))}
    prunekit.prune_channels(model, inputs, amount=0.5, heads=0.5, hidden=0.5)
    with torch.no_grad():
        model(**inputs)  # the masked weights as a forward leaves them
    fields = model.config.to_dict()
    before = fingerprint(model)

    def refuse(*args: object) -> None:
        raise RuntimeError("compact: refused by the test")

    monkeypatch.setattr(sys.modules["prunekit.structure.compaction.compact"], "_compare", refuse)
    with pytest.raises(RuntimeError, match="refused by the test"):
        prunekit.compact(model, inputs, latency_runs=0)
    assert model.config.to_dict() == fields
    assert fingerprint(model) == before
    monkeypatch.undo()
    report = prunekit.compact(model, inputs, latency_runs=2)
    assert report.latency is not None and report.config["hidden_size"] == 8
    assert model.config.hidden_size == 8 and model.config.num_attention_heads == 2


def test_transposed_convolutions_count_their_multiply_accumulates() -> None:
    # Every input position meets every entry of its weight once: 1 x 4 x 9 x 9 inputs times
    # a (4, 6, 3, 3) kernel, whatever the stride and padding.
    up = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1)
    x = torch.randn(1, 4, 9, 9)
    assert count_macs(up, (x,), {}) == 81 * 4 * 6 * 9
    assert macs_per_entry(up, (x,), {}) == {id(up.weight): 81}
    grouped = nn.ConvTranspose1d(4, 6, 3, groups=2)
    assert count_macs(grouped, (torch.randn(2, 4, 5),), {}) == 2 * 5 * 4 * 3 * 3


def test_latency_ms_refuses_runs_below_one() -> None:
    with pytest.raises(ValueError, match=r"latency_ms: invalid runs=0; expected an int >= 1"):
        latency_ms(nn.Linear(2, 2), (torch.randn(1, 2),), {}, runs=0)


class _Logits(torch.nn.Module):
    """A causal LM whose next-token logits are fixed rows of `table` by the current token."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.table[input_ids]


def test_perplexity_of_uniform_logits_is_the_vocabulary_size() -> None:
    ids = torch.tensor([1, 4, 2, 0, 3])
    assert perplexity(_Logits(torch.zeros(5, 5)), [ids, ids[:2]]) == pytest.approx(5.0)


def test_perplexity_weighs_every_predicted_token_alike() -> None:
    table = torch.full((3, 3), -1e9)
    table[0, 1] = table[1, 2] = table[2, 0] = 0.0  # 0 -> 1 -> 2 -> 0 is certain
    table[2] = 0.0  # after 2: uniform over 3
    short, long = torch.tensor([0, 1, 2, 0]), torch.tensor([0, 1])
    # predicted: 1 (p=1), 2 (p=1), 0 (p=1/3) and 1 (p=1): exp(log 3 / 4)
    assert perplexity(_Logits(table), [short, long]) == pytest.approx(3 ** (1 / 4))


@pytest.mark.parametrize("windows", [[], [torch.tensor([1])], [torch.zeros(2, 3).long()]])
def test_perplexity_refuses_windows_it_cannot_measure(windows: list[torch.Tensor]) -> None:
    with pytest.raises(
        ValueError, match=r"perplexity: windows of lengths .* expected at least one"
    ):
        perplexity(_Logits(torch.zeros(5, 5)), windows)


def test_a_perplexity_beyond_a_float_is_inf_not_an_overflow_error() -> None:
    """A model sure of the wrong token: a mean loss of 1e9 per token, exp of which no float
    holds (math.exp raised OverflowError: 'math range error')."""
    table = torch.full((3, 3), -1e9)
    table[:, 0] = 0.0  # always 0 next; the windows never go to 0
    assert perplexity(_Logits(table), [torch.tensor([1, 2, 1, 2])]) == math.inf
