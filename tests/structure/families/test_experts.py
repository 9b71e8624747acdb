"""Routed experts of Hugging Face mixture-of-experts models (small configs, random init):
masked by each criterion, compacted, compared with the masked model, saved and reloaded."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint

T = pytest.importorskip("transformers")

IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))
INPUTS = {"input_ids": IDS}
CALIBRATION = [torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(k))
               for k in range(3)]  # fmt: skip
H, INNER, EXPERTS, TOP_K, LAYERS = 32, 16, 8, 2, 2
# family -> (config class, name of its expert count, its experts' inner width field)
FAMILIES = {
    "mixtral": ("MixtralConfig", "num_local_experts", "intermediate_size"),
    "qwen2_moe": ("Qwen2MoeConfig", "num_experts", "moe_intermediate_size"),
    "qwen3_moe": ("Qwen3MoeConfig", "num_experts", "moe_intermediate_size"),
    "olmoe": ("OlmoeConfig", "num_experts", "intermediate_size"),
}


def make(family: str, seed: int = 0) -> Any:
    name, count, inner = FAMILIES[family]
    settings: dict[str, Any] = dict(vocab_size=100, hidden_size=H, num_hidden_layers=LAYERS,
                                    num_attention_heads=4, num_key_value_heads=2,
                                    num_experts_per_tok=TOP_K, max_position_embeddings=32,
                                    pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    settings.update({count: EXPERTS, inner: INNER})
    if family == "qwen2_moe":
        settings.update(shared_expert_intermediate_size=24, intermediate_size=40)
    torch.manual_seed(seed)
    config = getattr(T, name)(**settings)
    return T.AutoModelForCausalLM.from_config(config).eval()


def _logits(model: nn.Module) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(**INPUTS).logits
    return out


def _generate(model: Any) -> Tensor:
    out: Tensor = model.generate(IDS, max_new_tokens=6, do_sample=False, pad_token_id=0)
    return out


def _close(a: Tensor, b: Tensor) -> None:
    assert a.shape == b.shape
    assert float((a - b).abs().max()) <= 1e-4 * float(b.abs().max())


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def mine(group: prunekit.ChannelGroup) -> Tensor:
    """A user's own criterion: the experts' down projections' L1 norms."""
    s = next(s for s in group.slices if s.name == "down_proj" and s.dim == 0)
    weight = getattr(s.module, s.name).detach()
    return torch.stack([weight[list(p)].abs().sum() for p in s.indices])


CRITERIA: dict[str, Any] = {"frequency": "frequency", "reap": "reap", "own": mine}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_experts_group_holds_the_router_rows_and_the_expert_weights(family: str) -> None:
    model = make(family)
    groups = [g for g in prunekit.channel_groups(model, INPUTS) if g.kind == "experts"]
    assert len(groups) == LAYERS and all(g.prunable and g.size == EXPERTS for g in groups)
    names = {(s.name, s.dim, s.role) for s in groups[0].slices}
    assert names == {("weight", 0, "out"), ("gate_up_proj", 0, "out"), ("down_proj", 0, "out")}
    assert "experts" in str(groups[0])


@pytest.mark.parametrize("criterion", CRITERIA)
@pytest.mark.parametrize("share", [0.25, 0.5])
@pytest.mark.parametrize("family", FAMILIES)
def test_experts_pruned_compacted_equal_to_the_masked_model(family: str, share: float,
                                                            criterion: str) -> None:  # fmt: skip
    model = make(family)
    before, dense = _params(model), _logits(model)
    shared = [p.detach().clone() for n, p in model.named_parameters() if "shared_expert" in n]
    batches = None if criterion == "own" else CALIBRATION
    chosen = prunekit.prune_channels(
        model, INPUTS, experts=share, criterion=CRITERIA[criterion], calibration=batches
    )
    gone = round(share * EXPERTS)
    assert [len(p.units) for p in chosen] == [gone] * LAYERS
    masked = _logits(model)
    assert not torch.allclose(masked, dense)
    masked_ids = _generate(model)
    report = prunekit.compact(model, INPUTS, latency_runs=0)
    _close(_logits(model), masked)
    assert torch.equal(_generate(model), masked_ids)
    kept = EXPERTS - gone
    _, count, _ = FAMILIES[family]
    assert getattr(model.config, count) == kept and model.config.num_experts_per_tok == TOP_K
    block = model.model.layers[0].mlp
    assert block.experts.num_experts == block.gate.num_experts == kept
    assert tuple(block.experts.gate_up_proj.shape) == (kept, 2 * INNER, H)
    assert tuple(block.gate.weight.shape) == (kept, H)
    assert before - report.params_after == LAYERS * gone * (3 * INNER * H + H)
    after = [p for n, p in model.named_parameters() if "shared_expert" in n]
    assert len(after) == len(shared) and all(map(torch.equal, after, shared))
    if share == 0.5:
        _reloads_equal(model, masked)


def _reloads_equal(model: Any, masked: Tensor) -> None:
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        again = T.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert torch.equal(_logits(again), _logits(model))
    _close(_logits(again), masked)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_load_balancing_loss_counts_the_experts_left(family: str) -> None:
    """The model's own expert count (read by its auxiliary load-balancing loss) follows the
    routers, so the compacted model trains with output_router_logits as a reloaded one."""
    model = make(family)
    prunekit.prune_channels(model, INPUTS, experts=0.5, criterion="l2")
    prunekit.compact(model, INPUTS, latency_runs=0)
    assert model.num_experts == EXPERTS // 2
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        again = T.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        mine = model(**INPUTS, labels=IDS, output_router_logits=True)
        theirs = again(**INPUTS, labels=IDS, output_router_logits=True)
    assert torch.equal(mine.aux_loss, theirs.aux_loss) and torch.equal(mine.loss, theirs.loss)


def test_a_masked_expert_is_never_routed_and_the_rest_renormalize() -> None:
    model = make("qwen3_moe")
    model.config.norm_topk_prob = True
    for layer in model.model.layers:
        layer.mlp.gate.norm_topk_prob = True
    prunekit.prune_channels(model, INPUTS, experts=0.5, criterion="l2")
    router = model.model.layers[0].mlp.gate
    gone = (~router.weight_mask.bool().any(1)).nonzero().flatten()
    seen: list[tuple[Tensor, Tensor]] = []
    router.register_forward_hook(lambda m, a, out: seen.append((out[1], out[2])))
    _logits(model)
    scores, index = seen[0]
    assert not torch.isin(index, gone).any()
    torch.testing.assert_close(scores.sum(-1), torch.ones(scores.shape[0]))


def test_frequency_counts_the_routers_choices() -> None:
    model = make("mixtral")
    groups = [g for g in prunekit.channel_groups(model, INPUTS) if g.kind == "experts"]
    picked: list[Tensor] = []
    router = model.model.layers[0].mlp.gate
    handle = router.register_forward_hook(lambda m, a, out: picked.append(out[2]))
    with torch.no_grad():
        for batch in CALIBRATION:
            model(batch)
    handle.remove()
    counts = torch.bincount(torch.cat([p.reshape(-1) for p in picked]), minlength=EXPERTS)
    criterion = prunekit.structure.scoring.criteria.builtin("frequency")
    criterion.prepare(model, groups, CALIBRATION, None)
    torch.testing.assert_close(criterion.scores(groups[0]), counts.double() / counts.sum())


def test_reap_is_the_mean_router_weighted_expert_output_norm() -> None:
    model = make("olmoe")
    groups = [g for g in prunekit.channel_groups(model, INPUTS) if g.kind == "experts"]
    experts = model.model.layers[1].mlp.experts
    calls: list[tuple[Tensor, Tensor, Tensor]] = []
    experts.register_forward_pre_hook(lambda m, a: calls.append(tuple(a)))  # type: ignore[arg-type]
    with torch.no_grad():
        for batch in CALIBRATION:
            model(batch)
    total, routed = torch.zeros(EXPERTS, dtype=torch.float64), torch.zeros(EXPERTS)
    for x, index, weights in calls:  # token by token, slot by slot
        for t in range(index.shape[0]):
            for k in range(index.shape[1]):
                e = int(index[t, k])
                w = experts.gate_up_proj[e].detach()
                gate, up = (w @ x[t]).chunk(2)
                out = experts.down_proj[e].detach() @ (torch.nn.functional.silu(gate) * up)
                total[e] += float(weights[t, k]) * float(out.norm())
                routed[e] += 1
    criterion = prunekit.structure.scoring.criteria.builtin("reap")
    criterion.prepare(model, groups, CALIBRATION, None)
    expected = total / routed.clamp_min(1).double()
    torch.testing.assert_close(criterion.scores(groups[1]), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [({"experts": 0.9}, r"invalid experts=0.9: the router model.layers.0.mlp.gate would keep 1 "
      r"of its 8 experts, fewer than the 2 it picks per token \(top_k\); expected experts <= "
      r"0.75"),
     ({"experts": 1.0}, r"invalid experts=1.0; expected a float in \[0, 1\)"),
     ({"experts": 0.5, "amount": 0.3, "criterion": "reap", "calibration": CALIBRATION},
      r"criterion 'reap' ranks routed experts only, but group .* is of kind 'channels'"),
     ({"experts": 0.5, "criterion": "frequency"}, r"needs calibration data")],
)  # fmt: skip
def test_bad_expert_arguments_are_refused_and_change_nothing(kwargs: dict[str, Any],
                                                             words: str) -> None:  # fmt: skip
    model = make("mixtral")
    before, config = fingerprint(model), model.config.to_dict()
    with pytest.raises(ValueError, match="prune_channels: .*" + words):
        prunekit.prune_channels(model, INPUTS, **kwargs)
    assert fingerprint(model) == before and model.config.to_dict() == config


def test_experts_on_a_model_without_experts_is_refused() -> None:
    config = T.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=4, intermediate_size=40)  # fmt: skip
    model = T.LlamaForCausalLM(config).eval()
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"experts=0.5, but LlamaForCausalLM has no mixture-of"):
        prunekit.prune_channels(model, INPUTS, experts=0.5)
    assert fingerprint(model) == before


def test_compact_refuses_a_router_left_with_fewer_experts_than_its_top_k() -> None:
    model = make("qwen3_moe")
    group = next(g for g in prunekit.channel_groups(model, INPUTS) if g.kind == "experts")
    for s in group.slices:  # every expert but one masked by hand
        mask = torch.ones_like(getattr(s.module, s.name))
        mask[1:] = 0
        prunekit.custom_from_mask(s.module, s.name, mask)
    # a forward recomputes each masked weight attribute: compare the state and the config
    state = {k: v.clone() for k, v in model.state_dict().items()}
    config = model.config.to_dict()
    with pytest.raises(ValueError, match=r"compact: the router model.layers.0.mlp.gate would "
                       r"keep 1 experts, fewer than the 2 it picks per token"):  # fmt: skip
        prunekit.compact(model, INPUTS, latency_runs=0)
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], v) for k, v in state.items())
    assert model.config.to_dict() == config
    assert model.model.layers[0].mlp.gate.num_experts == EXPERTS


def test_experts_mlp_and_hidden_together() -> None:
    model = make("qwen3_moe")
    prunekit.prune_channels(model, INPUTS, 0.25, heads=0.25, hidden=0.25, experts=0.25,
                            round_to=4)  # fmt: skip
    masked = _logits(model)
    report = prunekit.compact(model, INPUTS, latency_runs=0)
    _close(_logits(model), masked)
    assert report.config["num_experts"] == 6 and report.config["hidden_size"] == 24
    assert report.config["moe_intermediate_size"] == 12
    assert report.config["head_dim"] == 8 and not report.stale  # no longer hidden / heads
    _reloads_equal(model, masked)


def test_qwen2_moe_hidden_width_is_the_residual_with_the_shared_expert_gate_reading_it() -> None:
    model = make("qwen2_moe")
    groups = prunekit.channel_groups(model, INPUTS)
    hidden = [g for g in groups if g.kind == "hidden"]
    assert len(hidden) == 1 and hidden[0].prunable and hidden[0].size == H
    gate = {(s.name, s.dim, s.role) for s in hidden[0].slices
            if s.module_name == "model.layers.0.mlp.shared_expert_gate"}  # fmt: skip
    assert gate == {("weight", 1, "in")}  # its one output row is no unit of the width
    prunekit.prune_channels(model, INPUTS, 0.25, heads=0.25, hidden=0.25, experts=0.25,
                            round_to=4)  # fmt: skip
    masked = _logits(model)
    report = prunekit.compact(model, INPUTS, latency_runs=0)
    _close(_logits(model), masked)
    assert report.config["hidden_size"] == 24
    assert tuple(model.model.layers[0].mlp.shared_expert_gate.weight.shape) == (1, 24)
    _reloads_equal(model, masked)


def test_an_experts_width_grouped_mm_cannot_run_is_named_with_round_to() -> None:
    model = make("qwen3_moe")
    before = fingerprint(model)
    prunekit.prune_channels(model, INPUTS, 0.2, exclude=["*self_attn*"], round_to=1)  # 13: 52 B
    masked = fingerprint(model)
    with pytest.raises(RuntimeError, match=r"mlp\.experts.* 13 .*round_to=4"):
        prunekit.compact(model, INPUTS, latency_runs=0)
    assert fingerprint(model) == masked and masked != before


def _lopsided(group: prunekit.ChannelGroup) -> Tensor:
    """Scores that put seven experts of the first layer below every expert of the second."""
    router = next(s.module_name for s in group.slices if s.op == "route")
    if ".0." in router:
        return torch.tensor([1.0] * (EXPERTS - 1) + [100.0])
    return torch.arange(1.0, EXPERTS + 1)


def test_the_global_expert_limit_named_is_the_one_the_scores_allow() -> None:
    """Ranked together, the first router's seven lowest experts come first: 6 of the 16
    (0.375) is the most the call can mask before that router keeps fewer than top_k."""
    model = make("mixtral")
    before = fingerprint(model)
    words = r"experts=0.75: the router model.layers.0.mlp.gate would keep 1 of its 8 experts, "
    with pytest.raises(ValueError, match=words + r".*expected experts <= 0.375 "):
        prunekit.prune_channels(model, INPUTS, experts=0.75, scope="global", criterion=_lopsided)
    assert fingerprint(model) == before
    chosen = prunekit.prune_channels(model, INPUTS, experts=0.375, scope="global",
                                     criterion=_lopsided)  # fmt: skip
    assert [len(p.units) for p in chosen] == [6]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kwargs", [{"amount": 0.3, "heads": 0.25}, {"amount": 0.0, "hidden": 0.2}])
def test_by_default_expert_widths_are_ones_grouped_mm_runs(family: str, kwargs: Any) -> None:
    """grouped_mm reads rows of multiples of 16 bytes: without round_to, the experts' inner
    width and the hidden width their rows run over keep a multiple of 4 float32 channels
    (16 x 0.7 -> 12, not 11; 32 x 0.8 -> 28, not 26), and compact runs."""
    model = make(family)
    prunekit.prune_channels(model, INPUTS, **kwargs)
    masked = _logits(model)
    prunekit.compact(model, INPUTS, latency_runs=0)
    _close(_logits(model), masked)
    down = model.model.layers[0].mlp.experts.down_proj
    hidden, inner = int(down.shape[1]), int(down.shape[2])
    assert (hidden, inner) == ((H, 12) if kwargs["amount"] else (28, INNER))


@pytest.mark.parametrize("compensate", [True, "reference"])
@pytest.mark.parametrize("ids", ["in vocabulary", "out of vocabulary"])
def test_compensating_an_experts_inner_width_is_refused_not_skipped(compensate: Any,
                                                                    ids: str) -> None:  # fmt: skip
    """The fused experts' down projections read only the tokens routed to each expert, which
    the least-squares update does not gather: compensate= is refused for their widths
    (before anything is masked, whatever the batches hold), never silently left out."""
    model = make("qwen3_moe")
    before = fingerprint(model)
    high = 100 if ids == "in vocabulary" else 10_000
    batches = [torch.randint(0, high, (2, 12), generator=torch.Generator().manual_seed(k))
               for k in range(2)]  # fmt: skip
    with pytest.raises(ValueError, match=rf"prune_channels: compensate={compensate!r} cannot "
                       r"update model.layers.0.mlp.experts \(down_proj\).*routed"):  # fmt: skip
        prunekit.prune_channels(model, INPUTS, 0.25, compensate=compensate, calibration=batches,
                                exclude=["*self_attn*"])  # fmt: skip
    assert fingerprint(model) == before
    chosen = prunekit.prune_channels(model, INPUTS, 0.0, heads=0.5, compensate=compensate,
                                     calibration=CALIBRATION, exclude=["*mlp*"])  # fmt: skip
    assert chosen and all(p.group.kind == "heads" for p in chosen)


def test_compact_with_router_logits_on_compares_what_stays_equal() -> None:
    """With output_router_logits, the model also returns each router's logits (one per
    expert: fewer once compacted) and a load-balancing loss over the expert count: compact
    checks the outputs that stay equal, and the kept experts' logits are the masked ones."""
    model = make("qwen3_moe")
    model.config.output_router_logits = True
    chosen = prunekit.prune_channels(model, INPUTS, experts=0.25)
    with torch.no_grad():
        masked = model(**INPUTS)
    prunekit.compact(model, INPUTS, latency_runs=0)
    assert model.config.output_router_logits is True
    with torch.no_grad():
        after = model(**INPUTS)
    _close(after.logits, masked.logits)
    gone = set(chosen[0].units)
    kept = [e for e in range(EXPERTS) if e not in gone]
    assert after.router_logits[0].shape[-1] == len(kept)
    _close(after.router_logits[0], masked.router_logits[0][:, kept])
