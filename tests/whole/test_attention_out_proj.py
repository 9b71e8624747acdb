"""The calibrated methods prune a MultiheadAttention's out_proj: the attention reads its
weight without calling it, so no hook ever saw its input and prune_model left it dense,
silently, while every other Linear was pruned."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

import prunekit


def layer() -> nn.TransformerEncoderLayer:
    torch.manual_seed(0)
    made = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return made.eval()


def batches() -> list[Tensor]:
    torch.manual_seed(1)
    return [torch.randn(2, 5, 16) for _ in range(3)]


def attention_output(attention: nn.MultiheadAttention, x: Tensor) -> Tensor:
    """What out_proj multiplies: the heads' output, before the projection."""
    eye = torch.eye(attention.embed_dim)
    q = x.transpose(0, 1)
    found, _ = F.multi_head_attention_forward(
        q, q, q, attention.embed_dim, attention.num_heads, attention.in_proj_weight,
        attention.in_proj_bias, None, None, False, 0.0, eye, None, training=False,
        need_weights=False,
    )  # fmt: skip
    return found.transpose(0, 1)


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("wanda", {}),
        ("wanda", {"sequential": False}),
        ("wanda", {"scope": "global", "pattern": "unstructured", "sequential": False}),
        ("sparsegpt", {}),
        ("sparsegpt", {"sequential": True}),
        ("sparsegpt", {"sequential": False, "pattern": "2:4"}),
        ("taylor", {"loss": lambda output, batch: output.square().sum()}),
    ],
)
def test_the_calibrated_methods_prune_an_attentions_out_proj(
    method: str, options: dict[str, Any]
) -> None:
    model = layer()
    prunekit.prune_model(model, 0.5, method=method, calibration=batches(), **options)
    out_proj = model.self_attn.out_proj
    assert "self_attn.out_proj.weight_mask" in dict(model.named_buffers())
    zeros = float((out_proj.weight == 0).float().mean())
    assert zeros == 0.5 if options.get("scope") != "global" else 0 < zeros < 1
    assert "forward" not in vars(model.self_attn)  # the attention's own forward again
    x, attention = batches()[0], model.self_attn
    assert isinstance(attention, nn.MultiheadAttention)
    expected = attention(x, x, x, need_weights=False)[0]
    unpruned = F.linear(attention_output(attention, x), out_proj.weight, out_proj.bias)
    torch.testing.assert_close(expected, unpruned)  # the pruned weight is the one used


def test_wandas_out_proj_mask_ranks_by_the_attention_output() -> None:
    """The mask of out_proj alone is Wanda's on the inputs it really multiplies."""
    model = layer()
    attention = model.self_attn
    inputs = torch.cat([attention_output(attention, x).reshape(-1, 16) for x in batches()])
    scores = attention.out_proj.weight.detach().abs() * inputs.norm(dim=0)
    kept = scores >= scores.sort(dim=1).values[:, 8:9]  # 'row': 8 of each row's 16
    prunekit.prune_model(model, 0.5, method="wanda", calibration=batches(),
                         include=("self_attn.out_proj",))  # fmt: skip
    assert torch.equal(attention.out_proj.get_buffer("weight_mask").bool(), kept)
    assert not hasattr(model.self_attn, "in_proj_weight_mask")


def test_a_failed_call_leaves_the_attention_as_it_was() -> None:
    """The attention runs with an identity in place of out_proj while calibrating: a batch
    the model refuses leaves its own forward, its out_proj and every tensor as they were."""
    model = layer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out_proj = model.self_attn.out_proj
    bad = [torch.randn(2, 5, 16), torch.randn(2, 5, 15)]
    with pytest.raises(ValueError, match="batch 1"):
        prunekit.prune_model(model, 0.5, method="sparsegpt", calibration=bad)
    assert "forward" not in vars(model.self_attn) and model.self_attn.out_proj is out_proj
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
