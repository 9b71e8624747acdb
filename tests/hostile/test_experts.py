"""Hostile cases of routed experts in structural pruning: the criteria that rank them from
calibration ('frequency', 'reap') on padded batches, and a refusal that names the batch and
leaves the model as it was."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

import prunekit
from hostile.support import refused
from prunekit.structure.scoring.criteria import builtin

T = pytest.importorskip("transformers")

IDS = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(1))


def _moe() -> Any:
    torch.manual_seed(0)
    config = T.Qwen3MoeConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                              intermediate_size=48, pad_token_id=0)  # fmt: skip
    return T.Qwen3MoeForCausalLM(config).eval()


def _padded(extra: int = 10) -> dict[str, Tensor]:
    """IDS with `extra` pad tokens on the right, masked out: the tokens before them compute
    what they computed alone (causal attention, the same positions)."""
    pads = torch.zeros(IDS.shape[0], extra, dtype=IDS.dtype)
    mask = torch.cat([torch.ones_like(IDS), torch.zeros_like(pads)], dim=1)
    return {"input_ids": torch.cat([IDS, pads], dim=1), "attention_mask": mask}


def _scores(model: Any, name: str, batches: list[Any]) -> list[Tensor]:
    groups = [g for g in prunekit.channel_groups(model, {"input_ids": IDS}) if g.kind == "experts"]
    criterion = builtin(name)
    criterion.prepare(model, groups, batches, None)
    return [criterion.scores(g) for g in groups]


@pytest.mark.parametrize("name", ["frequency", "reap"])
def test_padding_an_attention_mask_leaves_out_does_not_rank_the_experts(name: str) -> None:
    """The pad tokens are routed too: counted, they moved the frequencies (0.125 -> 0.047)
    and REAP's means toward the experts the pad token goes to."""
    model = _moe()
    alone = _scores(model, name, [{"input_ids": IDS}])
    padded = _scores(model, name, [_padded()])
    for a, b in zip(alone, padded, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-12)


def test_a_padded_batch_among_unpadded_ones_counts_its_tokens_only() -> None:
    model = _moe()
    other = torch.randint(3, 100, (1, 9), generator=torch.Generator().manual_seed(2))
    alone = _scores(model, "frequency", [{"input_ids": IDS}, other])
    padded = _scores(model, "frequency", [_padded(4), other])
    for a, b in zip(alone, padded, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-12)


def test_pruning_experts_on_padded_calibration_masks_those_unpadded_calibration_does() -> None:
    masks = []
    for batch in ({"input_ids": IDS}, _padded()):
        model = _moe()
        prunekit.prune_channels(model, {"input_ids": IDS}, experts=0.5, criterion="frequency",
                                calibration=[batch])  # fmt: skip
        masks.append([layer.mlp.gate.weight_mask.clone() for layer in model.model.layers])
    for a, b in zip(*masks, strict=True):
        assert torch.equal(a, b)


def test_an_attention_mask_of_another_shape_is_refused_naming_the_batch() -> None:
    """Which tokens it leaves out could not be told: refused, not read flat."""
    model = _moe()
    batch = {"input_ids": IDS, "attention_mask": torch.ones(2, 3, dtype=torch.long)}
    refused(lambda: prunekit.prune_channels(model, {"input_ids": IDS}, experts=0.5,
                                            criterion="frequency", calibration=[IDS, batch]),
            ValueError, r"^prune_channels: calibration batch 1 has an attention_mask of shape "
            r"\(2, 3\) for input_ids of shape \(2, 6\); expected the shape of its input_ids "
            r"\(one entry per token\)", model=model)  # fmt: skip


@pytest.mark.parametrize("name", ["frequency", "reap"])
def test_a_batch_the_model_cannot_take_is_named_as_the_other_criteria_name_it(name: str) -> None:
    """'activation' names the batch and the model's error; the expert criteria let the
    model's raw IndexError through."""
    model = _moe()
    out_of_vocab = torch.tensor([[1, 2, 500]])
    refused(lambda: prunekit.prune_channels(model, {"input_ids": IDS}, experts=0.25,
                                            criterion=name, calibration=[IDS, out_of_vocab]),
            ValueError, r"the model cannot take batch 1: IndexError", model=model)  # fmt: skip


def test_a_mask_of_as_many_entries_in_another_shape_is_refused() -> None:
    """A transposed mask gives one entry per token by count only: its entries were read
    flat as the tokens' (the model's forward takes it and computes with it)."""
    model = _moe()
    padded = _padded(2)
    batch = {"input_ids": padded["input_ids"], "attention_mask": padded["attention_mask"].T}
    refused(lambda: prunekit.prune_channels(model, {"input_ids": IDS}, experts=0.5,
                                            criterion="frequency", calibration=[batch]),
            ValueError, r"^prune_channels: calibration batch 0 has an attention_mask of shape "
            r"\(8, 2\) for input_ids of shape \(2, 8\); expected the shape of its input_ids "
            r"\(one entry per token\)", model=model)  # fmt: skip
