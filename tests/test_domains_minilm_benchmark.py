"""benchmarks/domains_minilm.py's helpers: the data-free windows of --minilm-augment and the
blended criterion of --minilm-blend, on a two-layer MLP."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import prunekit
from prunekit.structure.scoring.protocol import GroupCriterion
from prunekit.structure.scoring.weights import WeightNorm

_FOLDER = Path(__file__).resolve().parents[1] / "benchmarks"
_SPEC = importlib.util.spec_from_file_location("domains_minilm", _FOLDER / "domains_minilm.py")
assert _SPEC is not None and _SPEC.loader is not None
bench = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("domains_minilm", bench)
_SPEC.loader.exec_module(bench)


@pytest.mark.parametrize("spec", ["freq", "freq0", "words8", "freq8+", "8freq", "freq-1"])
def test_an_invalid_augment_item_is_refused_by_name(spec: str) -> None:
    with pytest.raises(SystemExit, match="--minilm-augment: invalid item"):
        bench.parse_augment(spec)


def test_augment_parses_each_item_and_none() -> None:
    assert bench.parse_augment("none") == []
    assert bench.parse_augment("freq32+random8+shuffle2") == [
        ("freq", 32), ("random", 8), ("shuffle", 2)
    ]  # fmt: skip


def test_augmented_windows_have_the_calibration_length_and_their_kind_of_tokens() -> None:
    windows = [torch.arange(2000, 2016), torch.arange(3000, 3016)]
    made = bench.augmented("random3+freq400+shuffle3", windows, seed=1)
    assert len(made) == 406 and all(w.shape == (16,) for w in made)
    assert all(int(w.min()) >= bench.FIRST_PIECE and int(w.max()) < bench.VOCABULARY
               for w in made[:3])  # fmt: skip
    drawn = torch.cat(made[3:403])  # Zipf: 'the', ',' and '.' lead, and rare pieces are rare
    counts = torch.bincount(drawn, minlength=bench.VOCABULARY)
    assert set(counts.topk(3).indices.tolist()) == {bench.COMMA, bench.PERIOD, bench.FIRST_WORD}
    assert int(counts[bench.FIRST_PIECE : bench.FIRST_WORD].sum()) == int(
        counts[bench.COMMA] + counts[bench.PERIOD]
    )  # no other character piece
    for k, window in enumerate(made[403:]):  # each a permutation of a calibration window
        assert sorted(window.tolist()) == windows[k % 2].tolist()
        assert not torch.equal(window, windows[k % 2])
    again = bench.augmented("random3+freq400+shuffle3", windows, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(made, again, strict=True))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def _masked(
    model: nn.Module, criterion: str | GroupCriterion, calibration: list[torch.Tensor] | None
) -> list[int]:
    pruned = prunekit.prune_channels(
        model, torch.randn(2, 8), 0.5, criterion=criterion, calibration=calibration
    )
    return sorted(pruned[0].units)


def test_blend_zero_is_activation_on_its_own_batches_not_the_calibration() -> None:
    own = [torch.randn(4, 8) * torch.linspace(0.1, 3, 8) for _ in range(3)]
    other = [torch.randn(4, 8) * torch.linspace(3, 0.1, 8) for _ in range(3)]
    expected = _masked(_mlp(), "activation", own)
    assert expected != _masked(_mlp(), "activation", other)  # the batches matter here
    assert _masked(_mlp(), bench.Blend(0.0, own), other) == expected


def test_blend_one_ranks_as_the_weights_norm() -> None:
    batches = [torch.randn(4, 8) * torch.linspace(0.1, 3, 8) for _ in range(3)]
    expected = _masked(_mlp(), "l2", None)
    assert expected != _masked(_mlp(), "activation", batches)
    assert _masked(_mlp(), bench.Blend(1.0, batches), batches) == expected


def test_blend_halfway_is_the_mean_of_the_two_relative_scores() -> None:
    model = _mlp()
    batches = [torch.randn(4, 8) for _ in range(2)]
    group = prunekit.channel_groups(model, torch.randn(2, 8))[0]
    half, zero = bench.Blend(0.5, batches), bench.Blend(0.0, batches)
    for criterion in (half, zero):
        criterion.prepare(model, [group], batches, None)
    a, w = zero.scores(group), WeightNorm(2).scores(group)
    assert torch.allclose(half.scores(group), 0.5 * a / a.mean() + 0.5 * w / w.mean())


@pytest.mark.parametrize("weight", [-0.1, 1.5, float("nan")])
def test_a_blend_weight_outside_zero_one_is_refused(weight: float) -> None:
    with pytest.raises(SystemExit, match="--minilm-blend: invalid weight"):
        bench.Blend(weight, [])


def test_blend_leaves_the_model_unpruned_when_only_prepared() -> None:
    model = _mlp()
    before = copy.deepcopy(model.state_dict())
    group = prunekit.channel_groups(model, torch.randn(2, 8))[0]
    bench.Blend(0.5, [torch.randn(4, 8)]).prepare(model, [group], None, None)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
