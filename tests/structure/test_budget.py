"""Budgets: one share of the parameters or MACs for the whole model, met across groups."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint

T = pytest.importorskip("transformers")
IDS = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))


class Convs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.c3 = nn.Conv2d(32, 24, 3, padding=1, bias=False)
        self.fc = nn.Linear(24, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn1(self.c1(x)))
        x = F.relu(self.c3(F.relu(self.c2(x))))
        return self.fc(x.mean((2, 3)))


X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))


def _llama(**overrides: Any) -> Any:
    settings: dict[str, Any] = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                                    intermediate_size=40, tie_word_embeddings=True,
                                    max_position_embeddings=32)  # fmt: skip
    return T.LlamaForCausalLM(T.LlamaConfig(**{**settings, **overrides})).eval()


def _largest_step(report: prunekit.BudgetReport, round_to: int) -> float:
    """The most one step of one group can remove: one unit (round_to of them, or one query
    head per key/value group), alone, as a share of the total."""
    worst = 0.0
    for pruned in report:
        g = pruned.group
        per_unit = 0.0
        for s in g.slices:
            p = s.module._parameters.get(s.name)
            if p is None:
                p = s.module._parameters.get(s.name + "_orig")
            if p is None or s.is_buffer:
                continue
            per_unit += max(len(i) for i in s.indices) * p.numel() / p.shape[s.dim]
        step = len(g.blocks) if g.blocks else (round_to if g.kind != "heads" else 1)
        worst = max(worst, per_unit * (step + round_to))  # a first step may be < 2 x round_to
    return worst / report.total


@pytest.mark.parametrize("share", [0.1, 0.3, 0.6])
@pytest.mark.parametrize("round_to", [1, 4])
def test_a_parameter_budget_is_met_within_one_step_and_compact_agrees(
    share: float, round_to: int
) -> None:
    model = Convs()
    report = prunekit.prune_channels(model, X, budget=prunekit.Budget(params=share),
                                     round_to=round_to)  # fmt: skip
    assert isinstance(report, prunekit.BudgetReport)
    assert report.total == sum(p.numel() for p in Convs().parameters())
    assert share <= report.achieved <= share + _largest_step(report, round_to)
    for row in report.rows:
        assert row.after >= 1 and (row.after == row.before or row.after % round_to == 0)
    compacted = prunekit.compact(model, X, latency_runs=0)
    assert report.achieved == pytest.approx(
        1 - compacted.params_after / compacted.params_before, abs=1e-12
    )


def test_a_mac_budget_counts_what_compact_counts() -> None:
    model = Convs()
    report = prunekit.prune_channels(model, X, budget=prunekit.Budget(macs=0.4))
    assert report.total == prunekit.structure.count_macs(Convs(), (X,), {})
    compacted = prunekit.compact(model, X, latency_runs=0)
    share = 1 - compacted.macs_after / compacted.macs_before
    assert report.achieved >= 0.4
    assert report.achieved == pytest.approx(share, abs=1e-12)


def test_the_allocation_follows_the_scores_across_layers() -> None:
    """Half of c2's channels are nearly zero: a budget of about that size takes them, and
    nothing from the other layers (a uniform share would take from every layer)."""
    model = Convs()
    with torch.no_grad():
        model.c2.weight[::2] *= 1e-3
        model.c2.bias[::2] *= 1e-3
    per_unit = 16 * 9 + 1 + 24 * 9
    share = 16 * per_unit / sum(p.numel() for p in model.parameters())
    report = prunekit.prune_channels(model, X, budget=prunekit.Budget(params=share * 0.99))
    assert [(r.name, r.after) for r in report.rows] == [
        ("c1.weight", 16), ("c2.weight", 16), ("c3.weight", 24)
    ]  # fmt: skip
    assert report[0].units == tuple(range(0, 32, 2))


def test_the_report_reads_as_a_table() -> None:
    report = prunekit.prune_channels(Convs(), X, budget=prunekit.Budget(params=0.2))
    lines = str(report).splitlines()
    total = sum(p.numel() for p in Convs().parameters())
    assert lines[0].startswith(f"budget 20.0% of {total:,} non-embedding parameters: removed ")
    assert lines[1].split() == ["group", "kind", "units", "kept"]
    assert [line.split()[:3] for line in lines[2:]] == [
        [r.name, "channels", str(r.before)] for r in report.rows
    ]


@pytest.mark.parametrize("gqa", ["query", "group"])
def test_llama_budget_keeps_gqa_and_embeddings_out_of_the_count(gqa: str) -> None:
    model = _llama(num_key_value_heads=2 if gqa == "query" else 4)
    budget = prunekit.Budget(params=0.4, kinds=("channels", "heads", "hidden"))
    report = prunekit.prune_channels(model, {"input_ids": IDS}, budget=budget, gqa=gqa)
    embedding = model.model.embed_tokens.weight
    everything = sum(p.numel() for p in model.parameters())
    assert report.total == everything - embedding.numel()
    for pruned in report:
        if pruned.group.blocks:  # the same count of query heads from every key/value group
            lost = [len(set(pruned.units) & set(b)) for b in pruned.group.blocks]
            assert len(set(lost)) == 1 and lost[0] < len(pruned.group.blocks[0])
    heads = [r for r in report.rows if r.kind == "heads"]
    assert heads and all(r.after >= 1 for r in heads)
    compacted = prunekit.compact(model, {"input_ids": IDS}, latency_runs=0)
    removed = compacted.params_before - compacted.params_after
    embedding_share = 100 * (32 - model.model.embed_tokens.weight.shape[1])
    assert report.removed == removed - embedding_share
    assert report.achieved >= 0.4


def test_embeddings_counted_when_asked() -> None:
    model = _llama()
    budget = prunekit.Budget(params=0.3, embeddings=True)
    report = prunekit.prune_channels(model, {"input_ids": IDS}, budget=budget)
    assert report.total == sum(p.numel() for p in model.parameters())
    assert not any(r.kind == "hidden" for r in report.rows)  # not among the default kinds


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"params": 1.5}, ValueError, "Budget: invalid params=1.5; expected a float in (0, 1)"),
        ({"params": 0.0}, ValueError, "invalid params=0.0"),
        ({"params": math.nan}, ValueError, "invalid params=nan"),
        ({"macs": -0.1}, ValueError, "invalid macs=-0.1"),
        ({"params": "0.2"}, TypeError, "invalid params='0.2'"),
        ({"params": True}, TypeError, "invalid params=True"),
        ({}, ValueError, "expected exactly one of them"),
        ({"params": 0.2, "macs": 0.2}, ValueError, "expected exactly one of them"),
        ({"params": 0.2, "kinds": ("mlp",)}, ValueError, "invalid kinds=('mlp',)"),
        ({"params": 0.2, "kinds": ()}, ValueError, "invalid kinds=()"),
        ({"params": 0.2, "kinds": ("heads", "heads")}, ValueError, "distinct kinds"),
        ({"params": 0.2, "kinds": "heads"}, TypeError, "invalid kinds='heads'"),
        ({"params": 0.2, "embeddings": 1}, TypeError, "invalid embeddings=1"),
        ({"macs": 0.2, "embeddings": True}, ValueError, "goes with params="),
        ({"latency": 1.0}, ValueError, "Budget: invalid latency=1.0; expected a float in (0, 1)"),
        ({"latency": 0.0}, ValueError, "invalid latency=0.0"),
        ({"latency": "fast"}, TypeError, "invalid latency='fast'"),
        ({"latency": 0.2, "macs": 0.2}, ValueError, "expected exactly one of them"),
        ({"latency": 0.2, "embeddings": True}, ValueError, "got latency=0.2"),
        ({"latency": 0.2, "runs": 0}, ValueError, "Budget: invalid runs=0; expected an int >= 1"),
        ({"latency": 0.2, "runs": 2.5}, TypeError, "invalid runs=2.5"),
        ({"latency": 0.2, "runs": True}, TypeError, "invalid runs=True"),
        ({"units": 1.0}, ValueError, "Budget: invalid units=1.0; expected a float in (0, 1)"),
        ({"units": "0.3"}, TypeError, "invalid units='0.3'"),
        ({"units": 0.3, "params": 0.3}, ValueError, "units=0.3; expected exactly one of them"),
        ({"units": 0.3, "floor": 1.0}, ValueError,
         "Budget: invalid floor=1.0; expected a float in [0, 1) (the least share"),
        ({"units": 0.3, "floor": {}}, ValueError, "invalid floor={}; expected a float"),
        ({"units": 0.3, "floor": {"c*": 1.5}}, ValueError,
         "invalid floor={'c*': 1.5}: 'c*' -> 1.5"),
        ({"units": 0.3, "floor": {"c*": "x"}}, TypeError, "'c*' -> 'x'; expected a float"),
        ({"units": 0.3, "floor": {3: 0.5}}, TypeError, "glob 3 is no str"),
        ({"units": 0.3, "floor": [0.5]}, TypeError, "invalid floor=[0.5]; expected a float"),
        ({"units": 0.3, "floor": -0.1}, ValueError, "invalid floor=-0.1"),
        ({"units": 0.3, "floor": math.nan}, ValueError, "invalid floor=nan"),
        ({"params": 0.3, "floor": "half"}, ValueError, "invalid floor='half'; expected a float"),
        ({"params": 0.3, "floor": True}, TypeError, "invalid floor=True"),
        ({"params": 0.3, "sensitivity": 1.5}, ValueError,
         "Budget: invalid sensitivity=1.5; expected a float in [0, 1]: how much a group's"),
        ({"params": 0.3, "sensitivity": -0.1}, ValueError, "invalid sensitivity=-0.1"),
        ({"params": 0.3, "sensitivity": math.nan}, ValueError, "invalid sensitivity=nan"),
        ({"params": 0.3, "sensitivity": "1"}, TypeError, "invalid sensitivity='1' of type str"),
        ({"params": 0.3, "sensitivity": True}, TypeError, "invalid sensitivity=True"),
    ],
)  # fmt: skip
def test_bad_budgets_are_refused(kwargs: dict[str, Any], error: type, words: str) -> None:
    with pytest.raises(error, match=re.escape(words)):
        prunekit.Budget(**kwargs)


HUGE_FLOORS = [10**400, -(10**400), 10**5000, {"c*": 10**400}, {"c*": 10**5000}]


@pytest.mark.parametrize("floor", HUGE_FLOORS, ids=["huge", "huge-negative", "too-long-to-print",
                                                    "glob-huge", "glob-too-long"])  # fmt: skip
def test_a_floor_of_a_huge_int_is_refused_by_name(floor: Any) -> None:
    refused = r"^Budget: invalid floor=.*; expected a float in \[0, 1\)"
    with pytest.raises(ValueError, match=refused):
        prunekit.Budget(params=0.2, floor=floor)


def test_numpy_numbers_are_taken() -> None:
    np = pytest.importorskip("numpy")
    budget = prunekit.Budget(
        latency=np.float32(0.25), runs=np.int64(3), floor={"c*": np.float32(0.5)}
    )
    assert (budget.share, budget.runs, budget.floor_of("c1")) == (0.25, 3, 0.5)
    assert prunekit.Budget(units=0.3, floor=np.float16(0.25)).floor_of("x") == 0.25
    assert isinstance(budget.floor_of("c1"), float)


def test_wrong_types_are_named() -> None:
    with pytest.raises(TypeError, match=re.escape("invalid params='0.2' of type str")):
        prunekit.Budget(params="0.2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape("invalid runs=2.5 of type float")):
        prunekit.Budget(latency=0.2, runs=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("invalid latency=inf")):
        prunekit.Budget(latency=math.inf)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"budget": 0.2}, TypeError, "invalid budget=0.2; expected a prunekit.Budget"),
        ({"budget": prunekit.Budget(params=0.2), "amount": 0.3}, ValueError, "got amount=0.3"),
        ({"budget": prunekit.Budget(params=0.2), "heads": 0.25}, ValueError, "got heads=0.25"),
        ({"budget": prunekit.Budget(params=0.2), "experts": 0.5}, ValueError,
         "got experts=0.5 too; expected amount, heads, hidden and experts left at 0"),
        ({"budget": prunekit.Budget(params=0.2), "scope": "global"}, ValueError,
         "expected scope='layer'"),
        ({"budget": prunekit.Budget(params=0.999)}, ValueError, "cannot be met"),
        ({"budget": prunekit.Budget(macs=0.999)}, ValueError, "cannot be met"),  # BatchNorm stats
        ({"budget": prunekit.Budget(params=0.9), "round_to": 16}, ValueError,
         "round_to=16"),
        ({"budget": prunekit.Budget(units=0.6, floor=0.5)}, ValueError,
         "can remove at most 50.00% of the units of the candidate groups counted (each group "
         "keeps at least one unit and floor=0.5 of its units)"),
    ],
)  # fmt: skip
def test_bad_arguments_leave_the_model_as_it_was(
    kwargs: dict[str, Any], error: type, words: str
) -> None:
    model = Convs()
    prunekit.prune_channels(model, X, 0.25)  # masked already: the masks must stay as they are
    before = _state(model)
    with pytest.raises(error, match=re.escape(words)):
        prunekit.prune_channels(model, X, **kwargs)
    assert _state(model) == before


def _state(model: nn.Module) -> dict[str, Any]:
    """The fingerprint, where a pruned tensor's computed attribute (remade by every forward,
    the graph's trace included) counts by its value, not its identity."""
    found = fingerprint(model)
    for path, entry in found.items():
        if path != "<state_dict>":
            entry["attrs"] = [(k, value) for k, _, value in entry["attrs"]]
    return found


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.attn(x, x, x, need_weights=False)[0]
        return out


def test_a_mac_budget_on_a_model_whose_macs_it_cannot_see_is_refused() -> None:
    """nn.MultiheadAttention runs its projections inside one function: no MAC is counted."""
    model, x = Attention(), torch.randn(2, 5, 8)
    before = _state(model)
    with pytest.raises(ValueError, match="Attention has no multiply-accumulates to count"):
        prunekit.prune_channels(model, x, budget=prunekit.Budget(macs=0.2))
    assert _state(model) == before
    report = prunekit.prune_channels(model, x, budget=prunekit.Budget(params=0.2))
    assert [(r.kind, r.after) for r in report.rows] == [("heads", 1)]


def _macs_as_time(model: nn.Module) -> Callable[..., prunekit.structure.measure.Paired]:
    """A stand-in for the probe's clock: one forward of `model` 'takes' 0.5 ms, plus 1 ms per
    million MACs of its linear layers, plus 0.01 ms per query-head feature (what attention's
    own products cost, which no weight counts), so the test is exact."""

    def timed(before: Callable[[], None], after: Callable[[], None], forward: Callable[[], Any],
              runs: int) -> prunekit.structure.measure.Paired:  # fmt: skip
        found = []
        for switch in (before, after):
            switch()
            found.append(_fake_ms(model, forward))
        ratio = found[0] / found[1]
        return prunekit.structure.measure.Paired(found[0], found[1], ratio, ratio, ratio, runs)

    return timed


def _fake_ms(model: nn.Module, forward: Callable[[], Any]) -> float:
    counter = prunekit.structure.measure._Macs()
    with torch.no_grad(), counter:
        forward()
    heads = sum(m.q_proj.weight.shape[0] for m in model.modules() if hasattr(m, "q_proj"))
    return 0.5 + counter.total / 1e6 + 0.01 * heads


def test_a_latency_budget_is_met_within_one_step_from_what_each_kind_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each kind's probe gives its milliseconds per MAC: a channel saves what its weights
    compute, a head also what attention's products with it cost (no weight counts them), so
    its rate is higher; the units chosen meet the target within one step of one group."""
    ids = torch.randint(0, 100, (1, 24), generator=torch.Generator().manual_seed(3))
    model = _llama(num_hidden_layers=3)
    monkeypatch.setattr(prunekit.structure.probe, "paired_latency", _macs_as_time(model))
    dense = _fake_ms(model, lambda: model(input_ids=ids))
    budget = prunekit.Budget(latency=0.3, kinds=("channels", "heads", "hidden"))
    report = prunekit.prune_channels(model, {"input_ids": ids}, budget=budget)
    assert report.total == pytest.approx(dense)
    assert report.rates["channels"] == pytest.approx(1e-6)
    assert report.rates["hidden"] == pytest.approx(1e-6)
    assert report.rates["heads"] > 2e-6  # its MACs and its share of attention's products
    one_step = _largest_step(report, 1) * 24 * max(report.rates.values())  # 24 tokens
    assert 0.3 <= report.achieved <= 0.3 + one_step
    assert model.config.intermediate_size == 40  # the probes left the model as it was
    prunekit.compact(model, {"input_ids": ids}, latency_runs=0)
    after = _fake_ms(model, lambda: model(input_ids=ids))
    assert 1 - after / dense == pytest.approx(report.achieved, abs=1e-9)


def test_a_latency_probe_leaves_the_model_as_it_was() -> None:
    """Timed for real (nothing is asserted of the times): the probes compact the model and
    put it back; only the masks of the chosen units stay."""
    model = _llama()
    reference = _llama()
    reference.load_state_dict(model.state_dict())
    budget = prunekit.Budget(latency=0.01, runs=1)
    try:
        report = prunekit.prune_channels(model, {"input_ids": IDS}, budget=budget)
    except ValueError as error:  # a loaded machine may time no gain at all
        assert "cannot be met" in str(error)
        return
    assert model.config.intermediate_size == 40
    assert report  # masks of the chosen units, on the values the model had
    ours, theirs = model.state_dict(), reference.state_dict()
    values = {k.removesuffix("_orig"): v for k, v in ours.items() if not k.endswith("_mask")}
    assert values.keys() == theirs.keys()
    assert all(torch.equal(values[k], theirs[k]) for k in theirs)
    assert [type(m) for m in model.modules()] == [type(m) for m in reference.modules()]
    assert model.config.to_dict() == reference.config.to_dict()


def test_a_latency_budget_no_kind_can_meet_is_refused_and_the_model_is_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Probes that time no gain (a model whose time is all fixed costs) leave nothing to
    remove: the budget is refused, the probes' compactions undone."""

    def no_gain(before: Callable[[], None], after: Callable[[], None], forward: Any,
                runs: int) -> prunekit.structure.measure.Paired:  # fmt: skip
        before()
        after()
        return prunekit.structure.measure.Paired(2.0, 2.0, 1.0, 1.0, 1.0, runs)

    monkeypatch.setattr(prunekit.structure.probe, "paired_latency", no_gain)
    model = Convs()
    prunekit.prune_channels(model, X, 0.25)
    before = _state(model)
    with pytest.raises(ValueError, match=re.escape("can remove at most 0.00% of the millisec")):
        prunekit.prune_channels(model, X, budget=prunekit.Budget(latency=0.2))
    assert _state(model) == before


@pytest.mark.parametrize("share", [0.1, 0.35, 0.7])
@pytest.mark.parametrize("round_to", [1, 4])
def test_a_unit_budget_counts_units_and_meets_its_share_within_one_step(
    share: float, round_to: int
) -> None:
    model = Convs()
    report = prunekit.prune_channels(model, X, budget=prunekit.Budget(units=share),
                                     round_to=round_to)  # fmt: skip
    sizes = {"c1.weight": 16, "c2.weight": 32, "c3.weight": 24}
    assert {r.name: r.before for r in report.rows} == sizes
    assert report.total == 72
    gone = sum(r.before - r.after for r in report.rows)
    assert report.removed == gone == sum(len(p.units) for p in report)
    assert share * 72 <= gone < share * 72 + 2 * round_to
    lines = str(report).splitlines()
    assert lines[0] == f"budget {share:.1%} of 72 units of the candidate groups: removed " + (
        f"{gone} ({gone / 72:.2%})"
    )
    compacted = prunekit.compact(model, X, latency_runs=0)
    assert compacted.params_after < compacted.params_before


def test_a_unit_budget_ranks_units_by_their_score_over_their_group_mean() -> None:
    """Every unit costs one: c1's channels, 30x below its group's mean where the others are
    only 2x, go first, whatever the parameters they hold."""
    model = Convs()

    def scores(group: Any) -> Tensor:
        out = torch.ones(group.size)
        weak = {"c1.weight": 30.0, "c3.weight": 2.0}.get(group.name)
        if weak is not None:
            out[:4] /= weak
        return out

    report = prunekit.prune_channels(model, X, criterion=scores,
                                     budget=prunekit.Budget(units=6 / 72))  # fmt: skip
    assert [(r.name, r.after) for r in report.rows] == [
        ("c1.weight", 12), ("c2.weight", 32), ("c3.weight", 22)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("sensitivity", "after"),
    [(0.0, [("c1.weight", 12), ("c2.weight", 25), ("c3.weight", 19)]),
     (0.5, [("c1.weight", 10), ("c2.weight", 32), ("c3.weight", 14)]),
     (1.0, [("c1.weight", 10), ("c2.weight", 32), ("c3.weight", 14)])],
)  # fmt: skip
def test_sensitivity_lets_a_group_whose_units_all_score_high_keep_them(
    sensitivity: float, after: list[tuple[str, int]]
) -> None:
    """Within each group the scores are spread alike; c2's are 4x those of the others.
    Compared within their groups only (0), every group loses about the same share (a
    quarter); with their levels (0.5, 1), c2 keeps all its units and the others lose more."""
    model = Convs()

    def scores(group: Any) -> Tensor:
        spread = torch.linspace(1.0, 2.0, group.size, dtype=torch.float64)
        return spread * (4.0 if group.name == "c2.weight" else 1.0)

    budget = prunekit.Budget(units=16 / 72, sensitivity=sensitivity)
    report = prunekit.prune_channels(model, X, criterion=scores, budget=budget)
    assert [(r.name, r.after) for r in report.rows] == after
    with torch.no_grad():
        masked = model(X)
        prunekit.compact(model, X)
        torch.testing.assert_close(model(X), masked, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("measure", ["params", "units"])
def test_a_floor_keeps_that_share_of_every_group(measure: str) -> None:
    """31 of c2's 32 channels score nearly nothing next to their group's mean: without a
    floor a budget takes more than half of them; a floor of 0.5 keeps 16 of them (a
    multiple of round_to at least), and the rest of the budget comes from the other groups."""

    def scores(group: Any) -> Tensor:
        if group.name == "c2.weight":
            return torch.tensor([1e-6] * 31 + [1.0])
        return torch.arange(1.0, group.size + 1) + 100

    share = {"params": 0.5, "units": 0.4}[measure]
    bare = prunekit.prune_channels(Convs(), X, criterion=scores,
                                   budget=prunekit.Budget(**{measure: share}))  # fmt: skip
    assert {r.name: r.after for r in bare.rows}["c2.weight"] < 16
    budget = prunekit.Budget(**{measure: share}, floor=0.5)
    for round_to in (1, 4):
        report = prunekit.prune_channels(Convs(), X, criterion=scores, budget=budget,
                                         round_to=round_to)  # fmt: skip
        assert report.achieved >= share
        kept = {r.name: r.after for r in report.rows}
        assert kept["c2.weight"] == 16  # down to its floor, no further
        assert all(r.after >= r.before / 2 for r in report.rows)
        assert kept["c1.weight"] < 16 or kept["c3.weight"] < 24


def test_a_floor_holds_in_every_key_value_group() -> None:
    model = _llama()  # 8 query heads in 2 key/value groups of 4
    budget = prunekit.Budget(units=0.4, kinds=("heads",), floor=0.5)
    report = prunekit.prune_channels(model, {"input_ids": IDS}, budget=budget)
    assert report.achieved >= 0.4
    for pruned in report:
        lost = [len(set(pruned.units) & set(b)) for b in pruned.group.blocks]
        assert lost == [2, 2]  # 0.4 of 16 heads: 2 steps of one head per kv group, per layer
    with pytest.raises(ValueError, match=re.escape("at most 50.00% of the units")):
        prunekit.prune_channels(_llama(), {"input_ids": IDS}, budget=prunekit.Budget(
            units=0.6, kinds=("heads",), floor=0.5))  # fmt: skip


@pytest.mark.parametrize(("measure", "share"), [("params", 0.3), ("params", 0.55), ("units", 0.4)])
def test_an_auto_floor_is_that_share_of_the_highest_floor_the_budget_allows(
    measure: str, share: float
) -> None:
    """The highest floor found by the call against a search over floors by hand: the budget
    is met at it and refused a little above it; every group keeps its auto floor."""

    def scores(group: Any) -> Tensor:  # c2's units score nearly nothing: it would lose most
        if group.name == "c2.weight":
            return torch.tensor([1e-6] * 31 + [1.0])
        return torch.arange(1.0, group.size + 1) + 100

    def met(floor: float) -> bool:
        try:
            prunekit.prune_channels(Convs(), X, criterion=scores, budget=prunekit.Budget(
                **{measure: share}, floor=floor))  # fmt: skip
        except ValueError:
            return False
        return True

    budget = prunekit.Budget(**{measure: share}, floor="auto")
    assert budget.floor == "auto"
    report = prunekit.prune_channels(Convs(), X, criterion=scores, budget=budget)
    assert report.floor is not None and report.achieved >= share
    highest = report.floor / prunekit.structure.budget.AUTO_FLOOR
    assert met(highest) and not met(highest + 2e-3)
    assert all(r.after >= math.ceil(report.floor * r.before - 1e-9) for r in report.rows)
    bare = prunekit.prune_channels(Convs(), X, criterion=scores,
                                   budget=prunekit.Budget(**{measure: share}))  # fmt: skip
    c2 = {r.name: r.after for r in bare.rows}["c2.weight"]
    assert {r.name: r.after for r in report.rows}["c2.weight"] > c2  # spread more evenly
    assert f"floor 'auto': {report.floor:.3f}" in str(report)


def test_an_auto_floor_on_a_budget_no_floor_can_meet_is_refused_and_the_model_kept() -> None:
    model = Convs()
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"cannot be met: .* \(each group keeps at least one "
                                         r"unit\); expected a smaller share"):  # fmt: skip
        prunekit.prune_channels(model, X, criterion="l1", budget=prunekit.Budget(
            units=0.97, floor="auto"))  # fmt: skip
    assert fingerprint(model) == before
    with pytest.raises(ValueError, match=r"floor_of\('c1'\): floor='auto' is found when"):
        prunekit.Budget(params=0.3, floor="auto").floor_of("c1")


def test_a_floor_per_glob_keeps_each_matching_group_its_share() -> None:
    """c2 matches the first glob (0.75), the others the catch-all (0.5); the budget stored
    its floors as pairs and the unit scores make c2 the group that would lose most."""

    def scores(group: Any) -> Tensor:
        if group.name == "c2.weight":
            return torch.tensor([1e-6] * 31 + [1.0])
        return torch.arange(1.0, group.size + 1) + 100

    budget = prunekit.Budget(units=0.3, floor={"c2*": 0.75, "*": 0.5})
    assert budget.floor == (("c2*", 0.75), ("*", 0.5))
    assert [budget.floor_of(n) for n in ("c2.weight", "c1.weight")] == [0.75, 0.5]
    assert prunekit.Budget(units=0.3, floor={"c2*": 0.75}).floor_of("c1.weight") == 0.0
    report = prunekit.prune_channels(Convs(), X, criterion=scores, budget=budget)
    kept = {r.name: r.after for r in report.rows}
    assert kept["c2.weight"] == 24
    assert kept["c1.weight"] >= 8 and kept["c3.weight"] >= 12
    assert sum(r.before - r.after for r in report.rows) == math.ceil(0.3 * 72)


@pytest.mark.filterwarnings("ignore:compact.*cannot rebuild")
def test_cuts_in_steps_with_compensation_between_meet_the_target_and_compact_exactly() -> None:
    """Several smaller cuts, each compensated (``Budget(params=t x k / n)`` for k = 1..n):
    each call counts the units masked before as removed, so the last meets t, keeps what
    the first masked, and the compacted model computes what the masked one does."""
    model = _llama(intermediate_size=64)
    calibration = [{"input_ids": torch.randint(0, 100, (2, 12), generator=torch.Generator()
                                               .manual_seed(k))} for k in range(3)]  # fmt: skip
    example = {"input_ids": IDS}
    first = prunekit.prune_channels(model, example, budget=prunekit.Budget(params=0.15),
                                    criterion="activation", calibration=calibration,
                                    compensate=True, round_to=4)  # fmt: skip
    masked_first = {n: b.clone() for n, b in model.named_buffers() if n.endswith("_mask")}
    second = prunekit.prune_channels(model, example, budget=prunekit.Budget(params=0.3),
                                     criterion="activation", calibration=calibration,
                                     compensate=True, round_to=4)  # fmt: skip
    assert 0.15 <= first.achieved < second.achieved and 0.3 <= second.achieved < 0.4
    for name, mask in model.named_buffers():
        if name in masked_first:
            assert bool((mask <= masked_first[name]).all())  # what went stays gone
    with torch.no_grad():
        masked = model(input_ids=IDS).logits
        compacted = prunekit.compact(model, example)
        torch.testing.assert_close(model(input_ids=IDS).logits, masked, atol=1e-4, rtol=1e-4)
    assert compacted.params_before - compacted.params_after == second.removed


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


MLP_X = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))


def spread(b_scale: float = 1.0, b_shift: float = 0.0) -> Callable[[Any], Tensor]:
    """Scores 1..2 in each group, b's scaled and shifted."""

    def scores(group: Any) -> Tensor:
        found = torch.linspace(1.0, 2.0, group.size, dtype=torch.float64)
        return found * b_scale + b_shift if group.name == "b.weight" else found

    scores.__name__ = "spread"
    return scores


@pytest.mark.parametrize(
    ("b_scale", "b_shift", "worst"),
    [
        (-1.0, 0.0, "-2 (unit 15)"),
        (1.0, -1.49, "-0.49 (unit 0)"),
        (1.0, -1.0 - 1e-6, "-1e-06 (unit 0)"),
    ],
)
@pytest.mark.parametrize(
    "options", [{"budget": prunekit.Budget(units=0.25)}, {"amount": 0.25, "scope": "global"}]
)
def test_negative_scores_compared_across_groups_are_refused(
    options: dict[str, Any], b_scale: float, b_shift: float, worst: str
) -> None:
    """Each unit's score is divided by its group's mean to compare groups: b's negative
    scores (a mean below 0 left them undivided, a mean near 0 made them huge) took all 8
    units from b, none from a, where the same spread of scores takes 4 from each."""
    model = Mlp()
    before = fingerprint(model)
    with pytest.raises(ValueError, match=(
        rf"prune_channels: criterion <function spread.* gave a negative score for group "
        rf"b\.weight: {re.escape(worst)}; expected scores >= 0 with "
        rf"(a budget|scope='global')"
    )):  # fmt: skip
        prunekit.prune_channels(model, MLP_X, criterion=spread(b_scale, b_shift), **options)
    assert fingerprint(model) == before


@pytest.mark.parametrize(
    "options", [{"budget": prunekit.Budget(units=0.25)}, {"amount": 0.25, "scope": "global"}]
)
def test_scores_of_one_spread_take_alike_from_each_group(options: dict[str, Any]) -> None:
    found = prunekit.prune_channels(Mlp(), MLP_X, criterion=spread(), **options)
    assert [(p.group.name, len(p.units)) for p in found] == [("a.weight", 4), ("b.weight", 4)]


def test_a_negative_of_rounding_counts_as_zero() -> None:
    """A score below 0 by less than 1e-9 of its group's largest (as 'obs' may round one)
    is 0: with b's lowest at -1e-12 b loses what it loses at 0."""
    budget = prunekit.Budget(units=0.25)
    rounded = prunekit.prune_channels(Mlp(), MLP_X, criterion=spread(1.0, -1.0 - 1e-12),
                                      budget=budget)  # fmt: skip
    exact = prunekit.prune_channels(Mlp(), MLP_X, criterion=spread(1.0, -1.0), budget=budget)
    assert [r.after for r in rounded.rows] == [r.after for r in exact.rows]


def test_negative_scores_within_one_group_only_still_rank() -> None:
    """scope='layer' without a budget compares a group's units among themselves only."""
    found = prunekit.prune_channels(Mlp(), MLP_X, 0.25, criterion=spread(-1.0))
    assert [(p.group.name, sorted(p.units)) for p in found] == [
        ("a.weight", [0, 1, 2, 3]), ("b.weight", [12, 13, 14, 15])
    ]  # fmt: skip


def _llama_params(hidden: int, widths: list[int], heads: list[int]) -> int:
    """The non-embedding parameters of a ``_llama()`` (head_dim 8, 2 key/value heads, no
    biases, the head tied) of residual width `hidden`, MLP widths and query heads per layer."""
    per_layer = [hidden * 8 * (2 * q + 2 * 2) + 3 * hidden * i + 2 * hidden
                 for i, q in zip(widths, heads, strict=True)]  # fmt: skip
    return sum(per_layer) + hidden


def test_an_auto_floor_with_hidden_steps_stops_at_the_nearest_total_the_steps_allow() -> None:
    """At the auto floor every group of this Llama has one step: 8 hidden channels (a
    quarter of the model), 8 MLP channels or 2 query heads per layer. The MLP and head
    steps together fall just short of 20 %, so the hidden step must go; taking it on top of
    all of them removed 40 %, where the hidden step alone is the nearest total at or above
    the target. The report counts what compact removes."""
    model = _llama()
    budget = prunekit.Budget(params=0.2, kinds=("channels", "heads", "hidden"), floor="auto")
    report = prunekit.prune_channels(model, {"input_ids": IDS}, budget=budget, round_to=8)
    total = _llama_params(32, [40, 40], [8, 8])
    assert report.total == total == 18080 and report.floor is not None
    least = [math.ceil(report.floor * n - 1e-9) for n in (32, 40, 4)]
    hiddens = [h for h in (8, 16, 24, 32) if h >= least[0]]
    widths = [w for w in (8, 16, 24, 32, 40) if w >= least[1]]
    heads = [2 * k for k in (1, 2, 3, 4) if k >= least[2]]
    assert (hiddens, widths, heads) == ([24, 32], [32, 40], [6, 8])  # one step each
    allowed = [total - _llama_params(h, [i0, i1], [q0, q1])
               for h in hiddens for i0 in widths for i1 in widths
               for q0 in heads for q1 in heads]  # fmt: skip
    nearest = min(r for r in allowed if r >= 0.2 * total)
    assert report.removed == nearest == total - _llama_params(24, [40, 40], [8, 8])
    kept = {r.kind: r.after for r in report.rows}
    rows = sorted((r.name, r.after) for r in report.rows if r.kind != "hidden")
    assert kept["hidden"] == 24 and [after for _, after in rows] == [40, 8, 40, 8]
    assert report.achieved == 0.25 and "removed 4,520 (25.00%)" in str(report)
    prunekit.compact(model, {"input_ids": IDS}, latency_runs=0)
    embedding = model.model.embed_tokens.weight.numel()
    assert sum(p.numel() for p in model.parameters()) - embedding == total - report.removed


def test_a_step_passing_the_target_by_more_than_a_smaller_one_removes_is_passed_over() -> None:
    """The hidden channels score lowest, so the hidden step (8 channels, 25 % of the model)
    comes first; a 3 % budget is met by one step of 8 MLP channels (768 parameters) instead.
    Before, the hidden step went and 25 % was removed."""

    def scores(group: Any) -> Tensor:  # 8 hidden channels score near nothing
        out = torch.arange(1.0, group.size + 1)
        if group.kind == "hidden":
            out[:8] = 1e-6
        return out

    model = _llama()
    budget = prunekit.Budget(params=0.03, kinds=("channels", "hidden"))
    report = prunekit.prune_channels(model, {"input_ids": IDS}, budget=budget, round_to=8,
                                     criterion=scores)  # fmt: skip
    assert report.removed == 3 * 32 * 8 and report.achieved < 0.05
    assert sorted(r.before - r.after for r in report.rows) == [0, 0, 8]
    assert {r.kind: r.after for r in report.rows}["hidden"] == 32
    prunekit.compact(model, {"input_ids": IDS}, latency_runs=0)
    embedding = model.model.embed_tokens.weight.numel()
    assert sum(p.numel() for p in model.parameters()) - embedding == 18080 - report.removed
