"""Whole blocks: ranked, skipped, removed (renumbered, config updated), replaced by a linear
map, saved and reloaded; bad arguments refused with the model unchanged."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint
from prunekit.structure.depth.linear import replacement_of, solve

T = pytest.importorskip("transformers")

IDS = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(1))


def calibration(labels: bool = False, count: int = 3) -> list[dict[str, Tensor]]:
    g = torch.Generator().manual_seed(2)
    batches = [{"input_ids": torch.randint(0, 100, (2, 16), generator=g)} for _ in range(count)]
    return [dict(b, labels=b["input_ids"]) for b in batches] if labels else batches


def llama(layers: int = 6) -> Any:
    config = T.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                           tie_word_embeddings=False)  # fmt: skip
    return T.LlamaForCausalLM(config).eval()


def generate(model: Any) -> Tensor:
    out: Tensor = model.generate(IDS, max_new_tokens=6, do_sample=False, pad_token_id=0)
    return out


def logits(model: Any, ids: Tensor = IDS) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(ids).logits
    return out


def block_params(model: Any, indices: tuple[int, ...]) -> int:
    return sum(p.numel() for i in indices for p in model.model.layers[i].parameters())


def close(a: Tensor, b: Tensor, rel: float = 1e-5) -> bool:
    return bool((a - b).abs().max() <= rel * b.abs().max())


def test_removed_model_generates_what_the_skipped_one_did() -> None:
    model = llama()
    dense = logits(model)
    result = prunekit.prune_blocks(model, calibration(), 2, criterion="influence")
    assert len(result.skipped) == 2 and len(result.scores) == 6
    assert prunekit.skipped_blocks(model) == {"model.layers": result.skipped}
    masked, masked_ids = logits(model), generate(model)
    assert not close(masked, dense)  # the skip changes what the model computes
    params = prunekit.structure.count_params(model)
    report = prunekit.remove_blocks(model)
    assert report.removed == result.skipped
    assert report.params_before - report.params_after == params - report.params_after
    assert params - report.params_after == block_params(llama(), result.skipped)
    assert model.config.num_hidden_layers == 4 and len(model.model.layers) == 4
    assert [b.self_attn.layer_idx for b in model.model.layers] == [0, 1, 2, 3]
    assert prunekit.skipped_blocks(model) == {}
    assert close(logits(model), masked)
    assert torch.equal(generate(model), masked_ids)


def test_first_and_inner_blocks_removed_by_hand_keep_the_cache_right() -> None:
    model = llama(5)
    prunekit.skip_blocks(model, [0, 2])
    masked = generate(model)
    prunekit.remove_blocks(model)
    assert [b.self_attn.layer_idx for b in model.model.layers] == [0, 1, 2]
    assert torch.equal(generate(model), masked)
    with torch.no_grad():  # prefill, then one token at a time through the cache
        out = model(IDS[:, :5], use_cache=True)
        step = model(IDS[:, 5:6], past_key_values=out.past_key_values, use_cache=True)
    assert close(step.logits[:, -1], logits(model, IDS[:, :6])[:, -1])


def test_per_layer_config_lists_follow_the_kept_blocks() -> None:
    config = T.Qwen2Config(vocab_size=100, hidden_size=32, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                           use_sliding_window=True, sliding_window=4,
                           max_window_layers=3)  # fmt: skip
    model = T.Qwen2ForCausalLM(config).eval()
    prunekit.skip_blocks(model, [1, 4])
    masked = generate(model)
    report = prunekit.remove_blocks(model)
    assert config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    assert config.max_window_layers == 2 and config.num_hidden_layers == 4
    assert report.config["num_hidden_layers"] == 4
    assert torch.equal(generate(model), masked)


def test_save_pretrained_and_from_pretrained_after_removal(tmp_path: Any) -> None:
    model = llama()
    prunekit.prune_blocks(model, calibration(), 2, replace="linear")
    masked = logits(model)
    prunekit.remove_blocks(model)
    assert close(logits(model), masked)
    model.save_pretrained(tmp_path)
    loaded = T.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.num_hidden_layers == 4
    assert torch.equal(logits(loaded), logits(model))
    assert torch.equal(generate(loaded), generate(model))


def _span_problem(model: Any, start: int, end: int,
                  batches: list[dict[str, Tensor]]) -> tuple[Tensor, Tensor]:  # fmt: skip
    """M (the down projection's output of block start - 1) and R (what M T should give:
    the span's output less the rest of block start - 1's output), as rows."""
    caught: dict[str, list[Tensor]] = {"m": [], "out": [], "target": []}
    layers = model.model.layers
    hooks = [
        layers[start - 1].mlp.down_proj.register_forward_hook(
            lambda mod, a, o: caught["m"].append(o)),
        layers[start - 1].register_forward_hook(lambda mod, a, o: caught["out"].append(o)),
        layers[end - 1].register_forward_hook(lambda mod, a, o: caught["target"].append(o)),
    ]  # fmt: skip
    with torch.no_grad():
        for batch in batches:
            model(**batch)
    for hook in hooks:
        hook.remove()
    m, out, target = (torch.cat(caught[k]).reshape(-1, 32).double() for k in ("m", "out",
                                                                             "target"))  # fmt: skip
    return m, target - (out - m)


def test_linear_map_is_the_least_squares_solution() -> None:
    model, batches = llama(), calibration(count=4)
    dense = llama()
    dense.load_state_dict(model.state_dict())
    result = prunekit.prune_blocks(model, batches, 2, replace="linear", ridge=0.0)
    ((start, end, name),) = result.replaced
    assert start >= 1 and result.skipped == (start, start + 1)
    found = replacement_of(model.get_submodule(name))
    assert found is not None and name == f"model.layers.{start - 1}.mlp.down_proj"
    m, r = _span_problem(dense, start, end, batches)
    reference = torch.linalg.lstsq(m, r).solution
    assert torch.allclose(found.map, reference, rtol=1e-6, atol=1e-8)
    # on the calibration data the map does at least as well as skipping (T = identity)
    assert (m @ found.map - r).norm() <= (m - r).norm()
    weight = model.get_submodule(name).weight.detach().double()
    masked = logits(model)
    prunekit.remove_blocks(model)
    folded = model.get_submodule(name).weight.detach().double()
    assert torch.allclose(folded, found.map.T @ weight, atol=1e-6)
    assert replacement_of(model.get_submodule(name)) is None
    assert close(logits(model), masked)


def test_ridge_solution_against_an_augmented_least_squares() -> None:
    g = torch.Generator().manual_seed(3)
    m, r = torch.randn(40, 6, generator=g).double(), torch.randn(40, 6, generator=g).double()
    ridge = 0.1
    lam = ridge * float((m.T @ m).diagonal().mean())
    augmented = torch.cat([m, math.sqrt(lam) * torch.eye(6, dtype=torch.float64)])
    target = torch.cat([r, torch.zeros(6, 6, dtype=torch.float64)])
    reference = torch.linalg.lstsq(augmented, target).solution
    assert torch.allclose(solve(m.T @ m, m.T @ r, ridge), reference, atol=1e-10)


def test_angular_picks_the_span_closest_in_angle() -> None:
    model, batches = llama(), calibration()
    result = prunekit.prune_blocks(model, batches, 2, criterion="angular")
    prunekit.unskip_blocks(model)
    assert len(result.scores) == 5  # one per start of 2 consecutive blocks
    with torch.no_grad():
        states = [model(**b, output_hidden_states=True).hidden_states for b in batches]
    for start in range(4):  # spans whose end is a block's input (the last state is normed)
        cos = torch.cat([nn.functional.cosine_similarity(h[start], h[start + 2], dim=-1)
                         .reshape(-1).double() for h in states])  # fmt: skip
        reference = float((torch.arccos(cos.clamp(-1, 1)) / math.pi).mean())
        assert result.scores[start] == pytest.approx(reference, rel=1e-4)
    best = min(range(5), key=lambda i: result.scores[i])
    assert result.skipped == (best, best + 1)


def test_loss_criterion_is_the_loss_increase_of_each_skip() -> None:
    model, batches = llama(4), calibration(labels=True)

    def mean_loss() -> float:
        with torch.no_grad():
            return sum(float(model(**b).loss) for b in batches) / len(batches)

    dense = mean_loss()
    result = prunekit.prune_blocks(model, batches, 1, criterion="loss")
    prunekit.unskip_blocks(model)
    prunekit.skip_blocks(model, [2])
    assert result.scores[2] == pytest.approx(mean_loss() - dense, rel=1e-5)
    prunekit.unskip_blocks(model)
    assert result.skipped == (min(range(4), key=lambda i: result.scores[i]),)


def test_own_criterion_and_bert_encoder() -> None:
    config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=4,
                          num_attention_heads=4, intermediate_size=40,
                          max_position_embeddings=32)  # fmt: skip
    model = T.BertModel(config, add_pooling_layer=False).eval()
    calls: list[Tensor] = []

    def criterion(before: Tensor, after: Tensor) -> Tensor:  # called block by block
        calls.append(after)
        return torch.tensor(0.0 if (len(calls) - 1) % 4 in (0, 3) else 1.0)

    result = prunekit.prune_blocks(model, calibration(), 2, criterion=criterion)
    assert len(calls) == 4 * 3  # 4 blocks x 3 batches
    assert result.blocks == "encoder.layer" and result.skipped == (0, 3)
    with torch.no_grad():
        masked = model(IDS).last_hidden_state
    prunekit.remove_blocks(model)
    assert config.num_hidden_layers == 2 and len(model.encoder.layer) == 2
    with torch.no_grad():
        assert close(model(IDS).last_hidden_state, masked)


def test_linear_replacement_refused_on_post_norm_blocks() -> None:
    config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=4,
                          num_attention_heads=4, intermediate_size=40,
                          max_position_embeddings=32)  # fmt: skip
    model = T.BertModel(config, add_pooling_layer=False).eval()
    before, saved = fingerprint(model), config.to_dict()
    with pytest.raises(ValueError, match=r"prune_blocks: replace='linear' needs encoder\.layer"):
        prunekit.prune_blocks(model, calibration(), 1, replace="linear")
    assert fingerprint(model) == before and config.to_dict() == saved


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fc(torch.relu(self.norm(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.ModuleList(Residual() for _ in range(5))
        self.extra = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)])
        self.head = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.body:
            x = block(x)
        return self.head(x)


def test_a_plain_module_list_given_by_name_with_a_linear_map() -> None:
    model, x = Net(), torch.randn(4, 8)
    batches = [torch.randn(16, 8) for _ in range(3)]
    result = prunekit.prune_blocks(model, batches, 2, blocks="body", replace="linear")
    assert result.blocks == "body" and result.replaced[0][2].endswith(".fc")
    masked = model(x)
    report = prunekit.remove_blocks(model, blocks="body")
    assert len(model.body) == 3 and report.folded == (result.replaced[0][2],)
    assert close(model(x), masked)


BAD: list[tuple[dict[str, Any], str]] = [
    ({"count": 6}, r"invalid count=6; expected an int in \[1, 6\)"),
    ({"count": 7}, r"invalid count=7"),
    ({"count": 0}, r"invalid count=0"),
    ({"count": -1}, r"invalid count=-1"),
    ({"count": 2.0}, r"invalid count=2\.0"),
    ({"count": True}, r"invalid count=True"),
    ({"amount": 1.0}, r"invalid amount=1\.0"),
    ({"amount": 0.05}, r"amount=0\.05 of the 6 blocks of model\.layers rounds to 0"),
    ({"amount": 0.5, "count": 2}, r"count=2, amount=0\.5; expected exactly one"),
    ({}, r"count=None, amount=None; expected exactly one"),
    ({"count": 2, "criterion": "cosine"}, r"unknown criterion='cosine'"),
    ({"count": 2, "criterion": 3}, r"invalid criterion=3"),
    ({"count": 2, "calibration": None}, r"calibration=None, but criterion='angular'"),
    ({"count": 2, "calibration": []}, r"calibration holds no batch"),
    ({"count": 2, "calibration": IDS}, r"invalid calibration of type Tensor"),
    ({"count": 2, "replace": "mlp"}, r"invalid replace='mlp'"),
    ({"count": 2, "ridge": -1.0}, r"invalid ridge=-1\.0"),
    ({"count": 2, "ridge": math.inf}, r"invalid ridge=inf; expected a finite float >= 0"),
    ({"count": 2, "ridge": math.nan}, r"invalid ridge=nan"),
    ({"count": 2, "blocks": "model.nothing"}, r"invalid blocks='model\.nothing'"),
    ({"count": 2, "blocks": "lm_head"}, r"invalid blocks='lm_head'"),
    ({"count": 2, "criterion": "loss"}, r"criterion='loss' needs one loss value per batch"),
    ({"count": 2, "criterion": lambda a, b: "x"}, r"criterion returned str for model\.layers\.0"),
    (
        {"n": 2, "calibration": [{"input_ids": torch.full((1, 4), 500)}]},
        r"the model cannot take calibration batch 0: IndexError",
    ),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD)
def test_bad_arguments_are_refused_and_change_nothing(kwargs: dict[str, Any],
                                                      message: str) -> None:  # fmt: skip
    model = llama()
    before, saved = fingerprint(model), model.config.to_dict()
    kwargs = {"calibration": calibration(), **kwargs}
    with pytest.raises((ValueError, TypeError), match=message) as caught:
        prunekit.prune_blocks(model, **kwargs)
    assert str(caught.value).startswith("prune_blocks: ")
    assert fingerprint(model) == before and model.config.to_dict() == saved
    assert prunekit.skipped_blocks(model) == {}


def test_the_old_name_n_of_count_warns_and_gives_the_same_blocks() -> None:
    """`n` is a norm order elsewhere: prune_blocks' number of blocks is `count`, and the old
    `n=` still works, with a FutureWarning naming the new one."""
    one = llama()
    two = copy.deepcopy(one)
    with pytest.warns(FutureWarning, match=r"prune_blocks: n= is renamed count=.*count=2"):
        old = prunekit.prune_blocks(one, calibration(), n=2, criterion="influence")
    new = prunekit.prune_blocks(two, calibration(), count=2, criterion="influence")
    assert old.skipped == new.skipped and old.scores == new.scores
    with pytest.raises(ValueError, match=r"prune_blocks: n= is the old name of count="):
        prunekit.prune_blocks(llama(), calibration(), 2, n=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"prune_blocks: unexpected keyword argument 'm'"):
        prunekit.prune_blocks(llama(), calibration(), 2, m=2)  # type: ignore[call-arg]


def test_remove_and_skip_refuse_what_they_cannot_do() -> None:
    model = llama(3)
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"remove_blocks: no block of model\.layers is skipped"):
        prunekit.remove_blocks(model)
    for bad in ([3], [0, 0], [], [0, 1, 2], [True]):
        with pytest.raises(ValueError, match="skip_blocks: "):
            prunekit.skip_blocks(model, bad)
    with pytest.raises(TypeError, match=r"skip_blocks: invalid indices=1 of type int; expected"):
        prunekit.skip_blocks(model, 1)  # type: ignore[arg-type]
    for call in (prunekit.skip_blocks, prunekit.unskip_blocks, prunekit.skipped_blocks):
        with pytest.raises(TypeError, match=r"model='llama' is no torch\.nn\.Module"):
            call("llama", *([[1]] if call is prunekit.skip_blocks else []))  # type: ignore[operator]
    assert fingerprint(model) == before
    prunekit.skip_blocks(model, [1])
    with pytest.raises(ValueError, match=r"blocks \[1\] of model\.layers are skipped already"):
        prunekit.prune_blocks(model, calibration(), 1)


def test_a_failed_removal_restores_model_and_config(monkeypatch: pytest.MonkeyPatch) -> None:
    model = llama(4)
    prunekit.prune_blocks(model, calibration(), 1, replace="linear")
    before, saved = fingerprint(model), model.config.to_dict()
    masked = logits(model)

    def broken(*args: Any) -> None:
        model.config.num_hidden_layers = 99
        raise RuntimeError("boom")

    monkeypatch.setattr("prunekit.structure.depth.remove.check_rebuilt", broken)
    with pytest.raises(RuntimeError, match="boom"):
        prunekit.remove_blocks(model)
    assert fingerprint(model) == before and model.config.to_dict() == saved
    assert torch.equal(logits(model), masked)


def test_gpt2_conv1d_projection_takes_the_map_too(tmp_path: Any) -> None:
    config = T.GPT2Config(vocab_size=100, n_embd=32, n_layer=4, n_head=4, n_positions=64)
    model = T.GPT2LMHeadModel(config).eval()
    result = prunekit.prune_blocks(model, calibration(), 2, criterion="influence",
                                   replace="linear")  # fmt: skip
    assert result.blocks == "transformer.h"
    assert all(name.endswith("mlp.c_proj") for _, _, name in result.replaced)
    masked, masked_ids = logits(model), generate(model)
    prunekit.remove_blocks(model)
    assert config.n_layer == 2 and [b.attn.layer_idx for b in model.transformer.h] == [0, 1]
    assert close(logits(model), masked) and torch.equal(generate(model), masked_ids)
    model.save_pretrained(tmp_path)
    loaded = T.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert torch.equal(logits(loaded), logits(model))


def _non_embedding(model: Any) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)


def test_a_budget_mixes_skipped_blocks_and_width() -> None:
    torch.manual_seed(0)
    model = llama(4)
    before = _non_embedding(model)
    inputs = {"input_ids": IDS}
    pruned = prunekit.prune_blocks(model, calibration(), 1, criterion="influence")
    gone = block_params(model, pruned.skipped)
    budget = prunekit.Budget(params=0.45, kinds=("channels", "heads", "hidden"))
    report = prunekit.prune_channels(model, inputs, budget=budget, round_to=4)
    assert report.depth == gone and report.total == before
    assert report.achieved >= 0.45 and report.removed - gone > 0  # the width met the rest
    skipped = f"model.layers.{pruned.skipped[0]}."
    assert not any(p.group.name.startswith(skipped) for p in report)  # no width in the block
    assert "in skipped blocks" in str(report)
    masked, masked_ids = logits(model), generate(model)
    prunekit.remove_blocks(model)
    assert [b.self_attn.layer_idx for b in model.model.layers] == [0, 1, 2]
    compacted = prunekit.compact(model, inputs, latency_runs=0)
    assert compacted.relative_error <= 1e-4
    assert close(logits(model), masked, 1e-4) and torch.equal(generate(model), masked_ids)
    after = _non_embedding(model)
    assert before - after == round(report.removed)  # counted as compact and removal made it
    assert model.config.num_hidden_layers == 3
