"""Differential: the vectorized group builder gives exactly the groups of a slow reference
written from the rules (tests/helpers/graph_reference.py), over torchvision models and small Hugging
Face configs (LLaMA with grouped-query heads, BERT, GPT-2, Mixtral's experts, ViT)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from helpers.graph_reference import reference_groups
from prunekit.structure.graph import grouping
from prunekit.structure.graph.graph import split_inputs
from prunekit.structure.graph.grouping import build_groups
from prunekit.structure.graph.groups import ChannelGroup, Slice
from prunekit.structure.graph.tables import HANDLERS
from prunekit.structure.trace.tracer import Tracer, compressed, run_traced


def _form(groups: list[ChannelGroup]) -> list[tuple[Any, ...]]:
    """Everything a group says: kind, size, reason, blocks, outputs and each slice whole (the
    module by identity)."""
    return [
        (g.kind, g.size, g.reason, g.blocks, g.outputs,
         [(s.module_name, id(s.module), s.name, s.dim, s.role, s.indices, s.channels, s.op)
          for s in g.slices])
        for g in groups
    ]  # fmt: skip


def _check(model: nn.Module, inputs: Any, gqa: str = "query") -> list[ChannelGroup]:
    args, kwargs = split_inputs(inputs, "test")
    tracer, _ = run_traced(model, args, kwargs, HANDLERS, {"gqa": gqa})
    fast = build_groups(tracer)
    assert _form(fast) == _form(reference_groups(tracer))
    assert _form(fast) == _form(prunekit.channel_groups(model, inputs, gqa=gqa))
    return fast


@pytest.fixture(scope="module")
def vision() -> Any:
    found = pytest.importorskip("helpers.vision")
    try:
        return found.torchvision_models()
    except ImportError as error:  # torchvision not installed
        pytest.skip(f"torchvision: {error}")


@pytest.mark.torchvision
@pytest.mark.parametrize(
    "name",
    ["resnet18", "mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_1", "densenet121",
     "regnet_x_400mf"],
)  # fmt: skip
def test_torchvision_groups_equal_the_reference(vision: Any, name: str) -> None:
    torch.manual_seed(0)
    model = vision.get_model(name).eval()
    groups = _check(model, torch.randn(1, 3, 32, 32))
    assert any(g.prunable for g in groups)


@pytest.mark.torchvision
def test_masked_model_and_vit_class_token_equal_the_reference(vision: Any) -> None:
    torch.manual_seed(0)
    model = vision.resnet18().eval()
    prunekit.prune_channels(model, torch.randn(1, 3, 32, 32), 0.3)
    _check(model, torch.randn(1, 3, 32, 32))
    vit = vision.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                   hidden_dim=16, mlp_dim=24).eval()  # fmt: skip
    groups = _check(vit, torch.randn(1, 3, 32, 32))  # class token and positions: elements
    assert {g.kind for g in groups} >= {"heads", "hidden"}


def _hf(name: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ids = {"input_ids": torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))}
    small = dict(vocab_size=100, max_position_embeddings=32)
    if name == "llama":
        config = T.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=8, num_key_value_heads=2,
                               tie_word_embeddings=True, **small)  # fmt: skip
        return T.LlamaForCausalLM(config).eval(), ids
    if name == "bert":
        config = T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=48, **small)  # fmt: skip
        return T.BertForMaskedLM(config).eval(), ids
    if name == "gpt2":
        config = T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=16)
        return T.GPT2LMHeadModel(config).eval(), ids
    config = T.MixtralConfig(hidden_size=32, intermediate_size=16, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                             num_experts_per_tok=2, **small)  # fmt: skip
    return T.MixtralForCausalLM(config).eval(), ids


@pytest.mark.parametrize("name", ["llama", "bert", "gpt2", "mixtral"])
def test_transformers_groups_equal_the_reference(name: str) -> None:
    model, ids = _hf(name)
    groups = _check(model, ids)
    kinds = {g.kind for g in groups}
    assert "heads" in kinds and "hidden" in kinds
    if name == "llama":  # grouped-query heads: blocks of query heads; whole groups too
        assert any(g.blocks for g in groups)
        _check(model, ids, gqa="group")
        prunekit.prune_channels(model, ids, 0.25)
        _check(model, ids)
    if name == "mixtral":
        assert "experts" in kinds


@pytest.mark.parametrize("multiplier", [0, 0x9E3779B97F4A7C15])
def test_equal_signatures_are_found_even_when_hashed_alike(
    multiplier: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Units are grouped by their runs of keys and a flag; runs that differ but hash alike (a
    multiplier of 0 hashes them by their length and flag only) still fall in different
    groups."""
    from prunekit.structure.graph import grouping

    monkeypatch.setattr(grouping, "_HASH", multiplier)
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(1, 4, (500,), generator=gen)
    runs = [torch.randint(0, 3, (int(n),), generator=gen) for n in counts]
    runs += runs[:50]  # some runs twice
    flag = torch.randint(0, 2, (len(runs),), generator=gen)
    flag[500:] = flag[:50]
    values = torch.cat(runs)
    run = torch.repeat_interleave(torch.arange(len(runs)), torch.tensor([len(r) for r in runs]))
    starts = torch.tensor([0, *torch.tensor([len(r) for r in runs]).cumsum(0).tolist()])
    found = grouping._same_runs(values, run, starts, flag)
    rows = torch.full((len(runs), 4), -1, dtype=torch.long)
    for k, r in enumerate(runs):
        rows[k, : len(r)] = r
    rows[:, -1] = flag
    exact = torch.unique(rows, dim=0, return_inverse=True)[1]
    same = found.unsqueeze(0) == found.unsqueeze(1)
    assert torch.equal(same, exact.unsqueeze(0) == exact.unsqueeze(1))
    assert len(torch.unique(exact)) < len(runs)  # some runs are equal


def test_slice_indices_are_cut_once_when_first_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builder hands slices their indices pending: nothing is cut before a slice is read,
    the first read cuts the indices of every slice of the build at once (then the channels),
    and the slices stay frozen."""
    cuts = []
    real = grouping._cut
    monkeypatch.setattr(grouping, "_cut", lambda *a: cuts.append(1) or real(*a))
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    groups = prunekit.channel_groups(model, torch.randn(2, 4))
    built = len(cuts)  # the outputs' positions (few) are cut at once
    first = groups[0].slices[0]
    assert first.indices == tuple((i,) for i in range(6))
    assert len(cuts) == built + 1
    sizes = [len(s.indices) for g in groups for s in g.slices]
    assert sizes == [6, 6, 6, 3, 3] and len(cuts) == built + 1
    assert first.indices is first.indices
    consumer = next(s for s in groups[0].slices if s.role == "in")
    assert consumer.channels == first.indices
    assert len(cuts) == built + 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.indices = ()  # type: ignore[misc]
    with pytest.raises(TypeError, match="indices"):
        Slice("0", model[0], "weight", 0, "out")  # type: ignore[call-arg]


def test_blocked_reasons_keep_each_text_once_in_the_order_found() -> None:
    """Each unit's reasons: the texts of the entries that block any of its ids, in the order
    of the first entry of each text (a text blocked again later is not repeated)."""
    tracer = Tracer()
    ids = tracer.new_ids(6)
    tracer.merge(ids[:1], ids[1:2])  # 0 and 1: one unit
    entries = [([1, 3], "b"), ([0], "a"), ([3, 4], "b"), ([0, 4], "c"), ([5], "b")]
    for blocked, why in entries:
        tracer.block(torch.tensor(blocked), why)
    roots = compressed(tracer.parents().clone())
    is_maker = torch.tensor([True, True, True, True, False, True, False])  # 4 makes nothing
    reasons = grouping._blocked(tracer, roots, is_maker)
    assert {u: r for u, r in reasons.items() if r} == {0: ["b", "a", "c"], 3: ["b"], 5: ["b"]}


def test_blocked_reasons_of_units_with_one_reason_each() -> None:
    """When no unit has two reasons, each gets a list of its own with its one text (units
    listed by root, their texts taken from the entries that blocked them)."""
    tracer = Tracer()
    ids = tracer.new_ids(6)
    tracer.merge(ids[2:3], ids[3:4])  # 2 and 3: one unit
    for blocked, why in [([5], "c"), ([3, 1], "a"), ([2], "a"), ([4], "b")]:
        tracer.block(torch.tensor(blocked), why)
    roots = compressed(tracer.parents().clone())
    reasons = grouping._blocked(tracer, roots, torch.ones(7, dtype=torch.bool))
    assert dict(reasons) == {1: ["a"], 2: ["a"], 4: ["b"], 5: ["c"]}
    reasons[1].append("d")  # the lists are the units' own
    assert reasons[2] == ["a"]


@pytest.mark.parametrize("seed", [0, 1])
def test_run_hashes_equal_the_polynomial_of_each_run(seed: int) -> None:
    """The running-sum hashes are, modulo 2**64, each run's own polynomial in the multiplier
    (computed run by run in Python integers)."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 6, (300,), generator=gen)
    values = torch.randint(-1, 1000, (int(counts.sum()),), generator=gen)
    flag = torch.randint(0, 2, (len(counts),), generator=gen)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    run = torch.repeat_interleave(torch.arange(len(counts)), counts)
    at = torch.arange(len(values)) - starts[run]
    found = grouping._run_hashes(values, at, starts, flag).tolist()
    h, wrap = grouping._HASH, 1 << 64
    for r, (low, high) in enumerate(zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)):
        code = (high - low + 1) * h + int(flag[r])
        code += sum((v + 2) * pow(h, j + 2, wrap) for j, v in enumerate(values[low:high].tolist()))
        assert found[r] % wrap == code % wrap


@pytest.mark.parametrize("span", [10, 1 << 40])
def test_parts_looked_up_densely_equal_those_searched(
    monkeypatch: pytest.MonkeyPatch, span: int
) -> None:
    """`_expand` of a table with one value per code: a dense lookup (narrow tables) gives the
    codes found and their values a search of the sorted keys gives; codes absent from the
    table are left out either way."""
    gen = torch.Generator().manual_seed(0)
    keys = torch.randperm(min(span, 1000), generator=gen)[:6].tolist()
    table = {k * (span // 10): [v] for v, k in enumerate(keys)}
    codes = torch.tensor(list(table) * 3 + [1, 3]) if span > 10 else torch.tensor(list(table) * 3)
    if span == 10:
        codes = torch.cat([codes, torch.tensor([k for k in range(10) if k not in table])])
    fast = grouping._expand(codes, table, span)
    monkeypatch.setattr(grouping, "_DENSE", -(1 << 62))  # searched whatever the width
    searched = grouping._expand(codes, table, span)
    which = torch.arange(len(codes)) if fast[0] is None else fast[0]
    assert searched[0] is not None
    assert torch.equal(which, searched[0]) and torch.equal(fast[1], searched[1])
    assert torch.equal(fast[1], torch.tensor([table[int(c)][0] for c in codes[which]]))


def test_distinct_codes_equal_unique_below_and_above_32_bits() -> None:
    gen = torch.Generator().manual_seed(0)
    for high in (1 << 20, 1 << 40):
        codes = torch.randint(0, high, (5000,), generator=gen)
        codes = torch.cat([codes, codes[:100], torch.tensor([0, high - 1])])
        assert torch.equal(grouping._distinct(codes), torch.unique(codes))
