"""Hostile budgets for prune_channels(..., budget=Budget(...)): a Budget out of range is
refused naming the parameter, the value and what is allowed; a budget the model cannot meet
(floors, round_to wider than a layer, kinds it lacks) is refused with the model left bit
for bit as it was; a budget met is what compact removes, and keeps its floors."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch

import prunekit
from hostile.support import refused
from prunekit import Budget

IDS = {"input_ids": torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))}


def llama() -> Any:
    from helpers import tiny_llm

    return tiny_llm.llama(layers=2)


BAD: list[tuple[str, dict[str, Any], type[BaseException], str]] = [
    ("params-0", {"params": 0}, ValueError,
     r"Budget: invalid params=0; expected a float in \(0, 1\)"),
    ("params-1", {"params": 1}, ValueError, r"invalid params=1; expected a float in \(0, 1\)"),
    ("params-1.0", {"params": 1.0}, ValueError, r"invalid params=1\.0"),
    ("params-nan", {"params": math.nan}, ValueError, r"invalid params=nan"),
    ("params-bool", {"params": True}, TypeError, r"invalid params=True of type bool"),
    ("params-str", {"params": "0.3"}, TypeError, r"invalid params='0\.3'"),
    ("none", {}, ValueError, r"expected exactly one of them"),
    ("two", {"params": 0.2, "macs": 0.2}, ValueError, r"expected exactly one of them"),
    ("sensitivity-above", {"params": 0.2, "sensitivity": 1.5}, ValueError,
     r"invalid sensitivity=1\.5; expected a float in \[0, 1\]"),
    ("sensitivity-below", {"params": 0.2, "sensitivity": -0.1}, ValueError,
     r"invalid sensitivity=-0\.1"),
    ("sensitivity-nan", {"params": 0.2, "sensitivity": math.nan}, ValueError,
     r"invalid sensitivity=nan"),
    ("sensitivity-bool", {"params": 0.2, "sensitivity": True}, TypeError,
     r"invalid sensitivity=True"),
    ("floor-1", {"params": 0.2, "floor": 1.0}, ValueError,
     r"invalid floor=1\.0; expected a float in \[0, 1\)"),
    ("floor-negative", {"params": 0.2, "floor": -0.5}, ValueError, r"invalid floor=-0\.5"),
    ("floor-AUTO", {"params": 0.2, "floor": "AUTO"}, ValueError, r"invalid floor='AUTO'.*'auto'"),
    ("floor-empty", {"params": 0.2, "floor": {}}, ValueError,
     r"invalid floor=\{\}.*not an empty one"),
    ("floor-share", {"params": 0.2, "floor": {"*": 1.5}}, ValueError, r"'\*' -> 1\.5"),
    ("floor-glob-int", {"params": 0.2, "floor": {3: 0.5}}, TypeError, r"glob 3 is no str"),
    ("kinds-str", {"params": 0.2, "kinds": "channels"}, TypeError, r"invalid kinds='channels'"),
    ("kinds-case", {"params": 0.2, "kinds": ("Channels",)}, ValueError,
     r"invalid kinds=\('Channels',\); expected distinct kinds among "
     r"\['channels', 'heads', 'hidden'\]"),
    ("kinds-empty", {"params": 0.2, "kinds": ()}, ValueError, r"at least one"),
    ("kinds-twice", {"params": 0.2, "kinds": ("heads", "heads")}, ValueError, r"distinct"),
    ("runs-0", {"latency": 0.2, "runs": 0}, ValueError, r"invalid runs=0; expected an int >= 1"),
    ("runs-bool", {"latency": 0.2, "runs": True}, TypeError, r"invalid runs=True"),
    ("runs-float", {"latency": 0.2, "runs": 2.0}, TypeError, r"invalid runs=2\.0"),
    ("embeddings-int", {"params": 0.2, "embeddings": 1}, TypeError, r"invalid embeddings=1"),
    ("embeddings-macs", {"macs": 0.2, "embeddings": True}, ValueError, r"goes with params="),
]  # fmt: skip


@pytest.mark.parametrize(("case", "options", "error", "match"), BAD, ids=[c[0] for c in BAD])
def test_a_bad_budget_is_refused_naming_the_parameter(
    case: str, options: dict[str, Any], error: type[BaseException], match: str
) -> None:
    with pytest.raises(error, match=match):
        Budget(**options)


def test_numpy_numbers_make_the_budget_their_python_numbers_make() -> None:
    given = Budget(params=np.float32(0.25), floor=np.float64(0.5), sensitivity=np.float32(0.5))
    assert given == Budget(params=0.25, floor=0.5, sensitivity=0.5)
    assert Budget(latency=0.2, runs=np.int64(3)).runs == 3


UNMET: list[tuple[str, Budget, dict[str, Any], str]] = [
    ("floor-caps-it", Budget(params=0.3, floor=0.6), {}, r"at most 17\.03%.*floor=0\.6"),
    ("glob-floor-caps-it", Budget(params=0.3, floor={"*mlp*": 0.9}), {},
     r"at most 11\.35%.*floor=\(\('\*mlp\*', 0\.9\),\)"),
    ("too-much", Budget(params=0.999), {}, r"at most 50\.17%"),
    ("units-floor", Budget(units=0.9, floor=0.5), {}, r"at most 50\.00% of the units"),
    ("round_to-wider-than-the-mlp", Budget(params=0.1, kinds=("channels",)), {"round_to": 65},
     r"at most 0\.00%.*a multiple of round_to=65"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "budget", "options", "match"), UNMET, ids=[c[0] for c in UNMET])
def test_a_budget_that_cannot_be_met_is_refused_with_what_it_allows(
    case: str, budget: Budget, options: dict[str, Any], match: str
) -> None:
    model = llama()
    refused(lambda: prunekit.prune_channels(model, IDS, budget=budget, **options), ValueError,
            rf"prune_channels: budget=Budget\(.*cannot be met.*{match}", model=model)  # fmt: skip


def test_a_kind_the_model_lacks_is_refused_naming_it() -> None:
    """A plain MLP has no heads: a budget of heads alone cannot be met."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    refused(lambda: prunekit.prune_channels(mlp, torch.randn(2, 8),
                                            budget=Budget(macs=0.3, kinds=("heads",))),
            ValueError, r"the groups of kinds \['heads'\] can remove at most 0\.00%",
            model=mlp)  # fmt: skip


@pytest.mark.parametrize("floor", [{"nothing*": 0.9}, {"*mlp*": 0.5, "*self-attn*": 0.5}],
                         ids=["one-glob", "a-typo-beside-one-that-matches"])  # fmt: skip
def test_a_floor_glob_that_matches_no_group_is_refused(floor: dict[str, float]) -> None:
    """A floor of a glob no group matches was silently no floor (a typo, 'self-attn' for
    'self_attn', kept nothing): refused naming the glob and the names groups have."""
    model = llama()
    refused(lambda: prunekit.prune_channels(model, IDS, budget=Budget(params=0.2, floor=floor)),
            ValueError, r"prune_channels: Budget\(floor=.*\) glob '(nothing|\*self-attn)\*' "
            r"matches no candidate group.*model\.layers\.0\.", model=model)  # fmt: skip


MET: list[tuple[str, Budget, dict[str, Any]]] = [
    ("params", Budget(params=0.3), {}),
    ("params-floor", Budget(params=0.15, floor=0.6), {}),
    ("params-glob-floor", Budget(params=0.1, floor={"*mlp*": 0.9, "*": 0.2}), {}),
    ("params-auto-floor", Budget(params=0.3, floor="auto"), {}),
    ("params-sensitivity-1", Budget(params=0.3, sensitivity=1.0), {}),
    ("params-hidden", Budget(params=0.3, kinds=("channels", "heads", "hidden")), {"round_to": 4}),
    ("params-embeddings", Budget(params=0.3, embeddings=True), {}),
    ("macs", Budget(macs=0.3), {}),
    ("tiny", Budget(params=1e-9), {}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "budget", "options"), MET, ids=[c[0] for c in MET])
def test_a_budget_met_is_what_compact_removes_and_keeps_its_floors(
    case: str, budget: Budget, options: dict[str, Any]
) -> None:
    model = llama()
    report = prunekit.prune_channels(model, IDS, budget=budget, **options)
    assert budget.share <= report.achieved <= 1.0
    for row in report.rows:
        if isinstance(budget.floor, float | tuple):
            least = math.ceil(budget.floor_of(row.name) * row.before)
            assert row.after >= max(least, 1), row
    if budget.measure == "params":
        compacted = copy.deepcopy(model)
        with pytest.warns(UserWarning, match=r"cannot rebuild the compacted model"):  # widths
            found = prunekit.compact(compacted, IDS, latency_runs=0)  # of its own a layer
        removed = found.params_before - found.params_after
        embedding = model.model.embed_tokens.weight.numel()  # counted with embeddings=True
        embedded = embedding - compacted.model.embed_tokens.weight.numel()
        assert removed - (0 if budget.embeddings else embedded) == report.removed
        with torch.no_grad():
            torch.testing.assert_close(compacted(**IDS).logits, model(**IDS).logits,
                                       rtol=1e-4, atol=1e-5)  # fmt: skip
