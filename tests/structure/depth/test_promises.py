"""Depth pruning keeps its promises under hostile use: a map folded into a pruned
projection, config fields that depend on layer indices, no tokens to score on, both
residual styles, one block at several positions, and a removal checked before it returns."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint

T = pytest.importorskip("transformers")

IDS = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(1))


def calibration(count: int = 3) -> list[dict[str, Tensor]]:
    g = torch.Generator().manual_seed(2)
    return [{"input_ids": torch.randint(0, 100, (2, 16), generator=g)} for _ in range(count)]


def llama(layers: int = 4) -> Any:
    torch.manual_seed(0)
    config = T.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                           tie_word_embeddings=False)  # fmt: skip
    return T.LlamaForCausalLM(config).eval()


def logits(model: Any, ids: Tensor = IDS) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(ids).logits
    return out


def close(a: Tensor, b: Tensor, rel: float = 1e-5) -> bool:
    return bool((a - b).abs().max() <= rel * b.abs().max())


def test_a_map_folds_into_a_projection_pruned_afterwards() -> None:
    model = llama()
    result = prunekit.prune_blocks(model, calibration(), 1, replace="linear")
    ((_, _, name),) = result.replaced
    prunekit.prune_channels(model, {"input_ids": IDS}, 0.25)
    linear = model.get_submodule(name)
    mask = linear.weight_mask.clone()
    assert not bool(mask.all())  # the projection's input channels are masked
    masked = logits(model)
    prunekit.remove_blocks(model)
    assert torch.equal(linear.weight_mask, mask)  # the mask stays, the map is in weight_orig
    assert "weight_orig" in linear._parameters and "weight" not in linear._parameters
    assert close(logits(model), masked)
    report = prunekit.compact(model, {"input_ids": IDS}, latency_runs=0)
    assert report.relative_error <= 1e-4


def test_a_map_is_not_folded_through_a_mask_of_the_outputs() -> None:
    model = llama()
    result = prunekit.prune_blocks(model, calibration(), 1, replace="linear")
    ((_, _, name),) = result.replaced
    prunekit.random_unstructured(model.get_submodule(name), "weight", amount=0.3)
    before, saved = fingerprint(model), model.config.to_dict()
    with pytest.raises(ValueError, match=rf"remove_blocks: cannot fold .* into {name}: "
                       rf"{name}\.weight is pruned with a mask that differs"):  # fmt: skip
        prunekit.remove_blocks(model)
    assert fingerprint(model) == before and model.config.to_dict() == saved
    assert prunekit.skipped_blocks(model) == {"model.layers": result.skipped}


def test_no_tokens_to_score_on_is_refused() -> None:
    model = llama()
    before = fingerprint(model)
    batches = [{"input_ids": IDS, "attention_mask": torch.zeros_like(IDS)} for _ in range(2)]
    for criterion in ("angular", "influence"):
        with pytest.raises(ValueError, match=r"prune_blocks: every attention_mask of the 2 "
                           r"calibration batches is all zero"):  # fmt: skip
            prunekit.prune_blocks(model, batches, 1, criterion=criterion)
    assert fingerprint(model) == before and prunekit.skipped_blocks(model) == {}
    batches[1]["attention_mask"][0, :3] = 1  # three tokens are enough
    assert len(prunekit.prune_blocks(model, batches, 1).skipped) == 1


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        block = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.body = nn.ModuleList([nn.Linear(8, 8), block, block, block])

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.body:
            x = layer(x)
        return x


def test_one_block_object_at_several_positions_is_refused() -> None:
    model, x = Shared(), torch.randn(4, 8)
    before = fingerprint(model)
    message = r"body holds one block object at positions \[1, 2, 3\]"
    with pytest.raises(ValueError, match=rf"skip_blocks: {message}"):
        prunekit.skip_blocks(model, [1], blocks="body")
    with pytest.raises(ValueError, match=rf"prune_blocks: {message}"):
        prunekit.prune_blocks(model, [x], 1, blocks="body")
    with pytest.raises(ValueError, match=rf"remove_blocks: {message}"):
        prunekit.remove_blocks(model, blocks="body")
    assert fingerprint(model) == before and prunekit.skipped_blocks(model) == {}


def qwen3_moe(**fields: Any) -> Any:
    torch.manual_seed(0)
    config = T.Qwen3MoeConfig(vocab_size=100, hidden_size=32, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                              moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                              **fields)  # fmt: skip
    return T.Qwen3MoeForCausalLM(config).eval()


def kinds(model: Any) -> list[str]:
    return [type(layer.mlp).__name__ for layer in model.model.layers]


@pytest.mark.parametrize(
    ("fields", "config"),
    [
        ({"decoder_sparse_step": 2}, {"decoder_sparse_step": 1, "mlp_only_layers": [1]}),
        ({"mlp_only_layers": [3]}, {"mlp_only_layers": [2]}),
    ],
)
def test_qwen3_moe_layer_kinds_survive_removal_and_reload(
    tmp_path: Any, fields: dict[str, Any], config: dict[str, Any]
) -> None:
    model = qwen3_moe(**fields)
    prunekit.skip_blocks(model, [0])
    masked, wanted = logits(model), kinds(model)[1:]
    report = prunekit.remove_blocks(model)
    assert report.config == {**config, "num_hidden_layers": 3}
    assert report.max_abs_diff == 0.0 and kinds(model) == wanted
    model.save_pretrained(tmp_path / "hf")
    loaded = T.Qwen3MoeForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert kinds(loaded) == wanted
    assert torch.equal(logits(loaded), masked)
    prunekit.save_compacted(model, tmp_path / "compacted")
    again = prunekit.load_compacted(tmp_path / "compacted")
    assert kinds(again) == wanted and torch.equal(logits(again), masked)


def test_a_step_rule_without_an_explicit_list_is_refused_by_name() -> None:
    torch.manual_seed(0)
    config = T.DeepseekV3Config(vocab_size=100, hidden_size=32, num_hidden_layers=4,
                                num_attention_heads=4, num_key_value_heads=4,
                                intermediate_size=48, moe_intermediate_size=16,
                                n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                topk_group=1, first_k_dense_replace=1, q_lora_rank=None,
                                kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                v_head_dim=8)  # fmt: skip
    config.moe_layer_freq = 2  # a rule some DeepSeek configs carry: MoE at every 2nd layer
    model = T.DeepseekV3ForCausalLM(config).eval()
    prunekit.skip_blocks(model, [2])
    before, saved = fingerprint(model), config.to_dict()
    with pytest.raises(ValueError, match=r"remove_blocks: the config's moe_layer_freq=2 gives "
                       r"each layer its kind by its position.*kept layer 3 \(now 2\)"):  # fmt: skip
        prunekit.remove_blocks(model)
    assert fingerprint(model) == before and config.to_dict() == saved


def test_a_config_the_rewrite_misses_is_caught_by_the_rebuild_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = qwen3_moe(decoder_sparse_step=2)
    prunekit.skip_blocks(model, [0])
    before, saved = fingerprint(model), model.config.to_dict()
    monkeypatch.setattr("prunekit.structure.depth.remove.rewrite",
                        lambda config, count, kept: {"num_hidden_layers": len(kept)})  # fmt: skip
    with pytest.raises(ValueError, match=r"remove_blocks: a model built from the updated config "
                       r"\(as from_pretrained builds it\) would differ from this one: "
                       r"model\.layers\.0\.mlp would be Qwen3MoeMLP, not Qwen3MoeSparseMoeBlock"
                       r".*decoder_sparse_step=2"):  # fmt: skip
        prunekit.remove_blocks(model)
    assert fingerprint(model) == before and model.config.to_dict() == saved
    assert prunekit.skipped_blocks(model) == {"model.layers": (0,)}


def test_sliding_window_layers_follow_their_blocks_through_a_reload(tmp_path: Any) -> None:
    torch.manual_seed(0)
    config = T.Gemma2Config(vocab_size=100, hidden_size=32, num_hidden_layers=5,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            intermediate_size=48, sliding_window=4)  # fmt: skip
    model = T.Gemma2ForCausalLM(config).eval()
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(3))
    types = list(config.layer_types)
    prunekit.skip_blocks(model, [0])
    masked = logits(model, ids)
    prunekit.remove_blocks(model, example_inputs={"input_ids": ids})
    assert config.layer_types == types[1:] and config.num_hidden_layers == 4
    model.save_pretrained(tmp_path)
    loaded = T.Gemma2ForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.layer_types == types[1:]
    assert close(logits(loaded, ids), masked)


class Added(nn.Module):
    """Blocks whose parent adds their output: h = h + block(h)."""

    def __init__(self, between: bool = False) -> None:
        super().__init__()
        self.body = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4))
        self.between = between

    def forward(self, x: Tensor) -> Tensor:
        for block in self.body:
            x = x + block(x)
            if self.between:
                x = x * 0.7
        return x


def test_a_skipped_block_adds_nothing_where_the_parent_adds_the_residual() -> None:
    torch.manual_seed(0)
    model, x = Added(), torch.randn(4, 8)
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"skip_blocks: cannot tell whether the parent of body "
                       r"takes each block's output.*expected example_inputs="):  # fmt: skip
        prunekit.skip_blocks(model, [1])
    assert fingerprint(model) == before and prunekit.skipped_blocks(model) == {}
    prunekit.skip_blocks(model, [1], example_inputs=x)
    skipped = model(x).detach()
    report = prunekit.remove_blocks(model)  # checked on the inputs the skip was found on
    assert report.max_abs_diff == 0.0 and len(model.body) == 3
    assert torch.equal(model(x), skipped)
    torch.manual_seed(0)
    model = Added()  # the same weights; prune_blocks finds the style on its calibration
    result = prunekit.prune_blocks(model, [x], 1, criterion="influence")
    skipped = model(x).detach()
    prunekit.remove_blocks(model)
    assert result.skipped and torch.equal(model(x), skipped)


def test_a_parent_that_does_more_between_its_blocks_is_refused() -> None:
    model, x = Added(between=True), torch.randn(4, 8)
    before = fingerprint(model)
    for call in (lambda: prunekit.skip_blocks(model, [1], example_inputs=x),
                 lambda: prunekit.prune_blocks(model, [x], 1)):  # fmt: skip
        with pytest.raises(ValueError, match=r"passes its input on to body\.1 neither way"):
            call()
    assert fingerprint(model) == before and prunekit.skipped_blocks(model) == {}


class Counted(nn.Module):
    """A parent whose output depends on how many blocks it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        for block in self.body:
            x = block(x)
        return x / len(self.body)


def test_a_removal_that_changes_the_outputs_is_refused_and_undone() -> None:
    model, x = Counted(), torch.randn(4, 8)
    prunekit.skip_blocks(model, [2], example_inputs=x)
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"remove_blocks: the model with blocks \[2\] of body "
                       r"removed differs from the model with them skipped by"):  # fmt: skip
        prunekit.remove_blocks(model)
    assert fingerprint(model) == before and len(model.body) == 4
    assert prunekit.skipped_blocks(model) == {"body": (2,)}


@pytest.mark.parametrize(
    ("inputs", "error", "message"),
    [
        ({"input_ids": torch.full((1, 3), 500)}, ValueError,
         r"remove_blocks: the model cannot take example_inputs: IndexError"),
        ({"nope": IDS}, ValueError, r"remove_blocks: the model cannot take example_inputs"),
        ("text", TypeError, r"remove_blocks: invalid example_inputs of type str; expected a "
         r"tensor, a mapping"),
    ],
)  # fmt: skip
def test_example_inputs_the_model_cannot_take_are_refused(inputs: Any, error: type,
                                                          message: str) -> None:  # fmt: skip
    model = llama()
    prunekit.skip_blocks(model, [2])
    before, saved = fingerprint(model), model.config.to_dict()
    with pytest.raises(error, match=message):
        prunekit.remove_blocks(model, example_inputs=inputs)
    assert fingerprint(model) == before and model.config.to_dict() == saved
    with pytest.raises(TypeError, match=r"skip_blocks: invalid example_inputs of type str"):
        prunekit.skip_blocks(model, [1], example_inputs="text")
    assert prunekit.skipped_blocks(model) == {"model.layers": (2,)}
    report = prunekit.remove_blocks(model)  # a few ids of the vocabulary
    assert report.max_abs_diff == 0.0 and "output check: max |diff|" in str(report)


class Masked(nn.Module):
    """Blocks h = h + block(h), then logits with one class ruled out (-inf)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)])
        self.head = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.body:
            x = x + block(x)
        ruled_out = torch.tensor([False, False, True, False])
        return self.head(x).masked_fill(ruled_out, float("-inf"))


def test_outputs_with_equal_infinities_are_no_difference() -> None:
    """-inf at one place in both outputs passes the check (inf - inf made it NaN)."""
    model, x = Masked(), torch.randn(4, 8)
    prunekit.skip_blocks(model, [1], blocks="body", example_inputs=x)
    skipped = model(x)
    report = prunekit.remove_blocks(model, blocks="body", example_inputs=x)
    assert len(model.body) == 2
    assert report.max_abs_diff == 0.0
    torch.testing.assert_close(model(x), skipped)
