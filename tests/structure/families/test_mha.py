"""torch's nn.MultiheadAttention: heads, MLP and hidden widths pruned and compacted, the
compacted subclass against nn.MultiheadAttention, and torchvision's vit_b_16."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from prunekit.structure.families.mha import CompactMultiheadAttention


class Block(nn.Module):
    """A pre-norm transformer block between a linear stem and a linear head."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 16)
        self.ln1 = nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=batch_first)
        self.ln2 = nn.LayerNorm(16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.stem(x)
        y = self.ln1(h)
        h = h + self.attn(y, y, y, need_weights=False)[0]
        h = h + self.fc2(torch.relu(self.fc1(self.ln2(h))))
        return self.head(h)


def _roundtrip(model: nn.Module, x: Tensor, **kwargs: Any) -> prunekit.CompactReport:
    model.eval()
    with torch.no_grad():
        dense = model(x)
    prunekit.prune_channels(model, x, **kwargs)
    with torch.no_grad():
        masked = model(x)
    assert not torch.allclose(dense, masked)
    report = prunekit.compact(model, x, latency_runs=0)
    with torch.no_grad():
        out = model(x)
    assert float((out - masked).abs().max()) <= 1e-4 * float(masked.abs().max())
    return report


def test_heads_masked_then_compacted_without_a_forward_between() -> None:
    """The first forward after masking makes out_proj's masked weight anew (its parent reads
    it without calling it): compact, run right after prune_channels, still finds the heads."""
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 5, 6)
    prunekit.prune_channels(model, x, amount=0.3, heads=0.5)
    masked = copy.deepcopy(model)
    report = prunekit.compact(model, x, latency_runs=0)
    assert model.attn.num_heads == 2 and model.fc1.out_features == 22
    assert report.groups == 2
    with torch.no_grad():
        expected, out = masked(x), model(x)
    assert float((out - expected).abs().max()) <= 1e-4 * float(expected.abs().max())


def test_heads_mlp_and_hidden_of_a_multihead_attention_block() -> None:
    model = Block()
    groups = prunekit.channel_groups(model, torch.randn(2, 5, 6))
    assert sorted((g.kind, g.size) for g in groups if g.prunable) == [
        ("channels", 32), ("heads", 4), ("hidden", 16)
    ]  # fmt: skip
    report = _roundtrip(model, torch.randn(2, 5, 6), amount=0.3, heads=0.25, hidden=0.25)
    assert (model.attn.num_heads, model.attn.embed_dim, model.ln1.normalized_shape) == (
        3,
        12,
        (12,),
    )
    assert type(model.attn) is nn.MultiheadAttention  # 3 heads of 4 make its 12: no subclass
    d, a, i = 12, 12, 22
    expected = 6 * d + d + 4 * d + 3 * a * d + 3 * a + a * d + d + d * i + i + i * d + d + 3 * d + 3
    assert report.params_after == expected


@pytest.mark.parametrize("batch_first", [True, False])
def test_fewer_heads_than_the_width_run_in_the_compact_subclass(batch_first: bool) -> None:
    model = Block(batch_first)
    x = torch.randn(2, 5, 6) if batch_first else torch.randn(5, 2, 6)
    _roundtrip(model, x, heads=0.5)
    assert isinstance(model.attn, nn.MultiheadAttention)
    assert type(model.attn) is CompactMultiheadAttention
    assert (model.attn.num_heads, model.attn.embed_dim) == (2, 16)
    assert model.attn.in_proj_weight.shape == (24, 16)
    assert "attn.in_proj_weight" in model.state_dict()  # the same keys


def _calls() -> list[dict[str, Any]]:
    pad = torch.tensor([[False] * 4 + [True], [False] * 5])
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    return [
        {},
        {"key_padding_mask": pad},
        {"attn_mask": causal, "average_attn_weights": False},
        {"attn_mask": torch.randn(5, 5), "key_padding_mask": pad},
        {"attn_mask": causal, "is_causal": True, "need_weights": False},
    ]


@pytest.mark.parametrize("batch_first", [True, False])
def test_the_compact_subclass_computes_what_multihead_attention_does(batch_first: bool) -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=batch_first).eval()
    compact = copy.deepcopy(mha)
    compact.__class__ = CompactMultiheadAttention
    x = torch.randn(2, 5, 8) if batch_first else torch.randn(5, 2, 8)
    memory = torch.randn_like(x)
    for kwargs in _calls():
        expected = mha(x, memory, memory, **kwargs)
        found = compact(x, memory, memory, **kwargs)
        torch.testing.assert_close(found[0], expected[0])
        if expected[1] is None:
            assert found[1] is None
        else:
            torch.testing.assert_close(found[1], expected[1])
    unbatched = x[0] if batch_first else x[:, 0]
    torch.testing.assert_close(compact(unbatched, unbatched, unbatched)[0],
                               mha(unbatched, unbatched, unbatched)[0])  # fmt: skip


def test_bias_kv_is_left_alone_with_a_reason() -> None:
    model = Block()
    model.attn = nn.MultiheadAttention(16, 4, batch_first=True, add_bias_kv=True)
    groups = prunekit.channel_groups(model, torch.randn(2, 5, 6))
    reasons = " ".join(g.reason or "" for g in groups)
    assert "MultiheadAttention (in attn): add_bias_kv and add_zero_attn are not handled" in reasons
    assert not any(g.kind == "heads" for g in groups)


@pytest.mark.torchvision
def test_torchvision_vit_b_16() -> None:
    vision = pytest.importorskip("helpers.vision")
    try:
        models = vision.torchvision_models()
    except ImportError as error:  # torchvision not installed
        pytest.skip(f"torchvision: {error}")
    model = models.vit_b_16().eval()
    nn.init.normal_(model.heads.head.weight)  # zeros at init: the output would be 0
    report = _roundtrip(model, torch.randn(1, 3, 224, 224), amount=0.3, heads=0.25, hidden=0.25)
    assert (model.hidden_dim, model.encoder.layers[0].self_attention.num_heads) == (576, 9)
    d, a, i = 576, 9 * 64, 3072 - 922  # round(0.3 x 3072) = 922 MLP channels go
    layer = 2 * d + 3 * a * d + 3 * a + a * d + d + 2 * d + d * i + i + i * d + d
    stem = 3 * 16 * 16 * d + d + d + 197 * d  # conv_proj, class token, positions
    assert report.params_after == stem + 12 * layer + 2 * d + 1000 * d + 1000
