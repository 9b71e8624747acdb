"""The whole-model layer: one registry of methods, one checked Config, one target selector,
and the one-shot engine's errors naming paths without state kept between calls."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import prunekit
from prunekit.io.streamed import METHODS as STREAMED
from prunekit.schedule.pruner import CRITERIA
from prunekit.tools.cli import build_parser
from prunekit.whole import Config, select_targets
from prunekit.whole.registry import CALIBRATED, METHODS, OFFLINE, SCOPES, find, names

SRC = Path(prunekit.__file__).parent


def test_the_registry_says_which_methods_calibrate_and_which_prune_files() -> None:
    assert tuple(METHODS) == ("l1", "random", "ln", "wanda", "sparsegpt", "taylor")
    assert CALIBRATED == ("wanda", "sparsegpt", "taylor")
    assert OFFLINE == ("l1", "random", "ln")
    assert find("magnitude") is METHODS["l1"]
    assert find("ln", among=CALIBRATED) is None
    assert find(3) is None


def test_every_entry_point_reads_the_registry() -> None:
    assert list(CRITERIA) == list(names(("l1", "random"), aliases=True))  # GradualPruner
    prune = build_parser()._subparsers._group_actions[0].choices["prune"]  # type: ignore[union-attr]
    choices = {a.dest: a.choices for a in prune._actions}
    # the file methods, then the calibrated ones a folder is pruned by block by block
    assert tuple(choices["method"]) == OFFLINE + STREAMED and tuple(choices["scope"]) == SCOPES
    assert set(STREAMED) <= set(CALIBRATED)


def test_scopes_are_written_once() -> None:
    found = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if re.search(r"""\(\s*["']layer["'],\s*["']global["']\s*\)""", path.read_text())
    ]
    assert found == ["whole/registry.py"]


@pytest.mark.parametrize("method", list(METHODS))
def test_each_registered_method_prunes_a_model(method: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    calibration = [torch.randn(3, 8) for _ in range(2)] if method in CALIBRATED else None
    loss = (lambda out, batch: out.square().sum()) if method == "taylor" else None
    found = prunekit.prune_model(model, 0.5, method=method, calibration=calibration, loss=loss)
    assert found["0.weight"].sparsity == 0.5


def test_config_is_checked_and_frozen() -> None:
    config = Config(method="wanda", amount=0.5, include="layers.*", owner="mine")
    assert config.include == ("layers.*",) and config.pattern is None  # as given
    assert config.chosen_pattern == "row"
    made = Config(method="wanda", amount=0.5, scope="global", sequential=False)
    assert made.chosen_pattern == "unstructured"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.amount = 0.9  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"mine: invalid method='obs'; expected one of l1, "):
        Config(method="obs", amount=0.5, owner="mine")
    with pytest.raises(ValueError, match=r"mine: invalid amount=1.5"):
        Config(amount=1.5, owner="mine")
    with pytest.raises(TypeError, match=r"mine: invalid exclude=\[3\]"):
        Config(amount=0.5, exclude=[3], owner="mine")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"mine: invalid sequential=1"):
        Config(amount=0.5, sequential=1, owner="mine")  # type: ignore[arg-type]


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.attn = nn.MultiheadAttention(4, 2)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_one_selector_finds_ties_and_out_proj() -> None:
    model = Tied()
    targets = {t.name: t for t in select_targets(model, ("*",), (), "mine")}
    assert list(targets) == ["embed.weight", "attn.in_proj_weight", "attn.out_proj.weight"]
    tied = targets["embed.weight"]
    assert [(p.holder, p.own) for p in tied.places] == [(model.embed, "weight"),
                                                        (model.head, "weight")]  # fmt: skip
    out = targets["attn.out_proj.weight"].first
    assert (out.module, out.leaf, out.holder, out.own) == (
        model.attn, "out_proj.weight", model.attn.out_proj, "weight"
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"^mine: 'embed.weight', 'head.weight' are one"):
        select_targets(model, ("*",), ("head.*",), "mine")
    with pytest.raises(ValueError, match=r"^mine: the pattern 'x\*' matches no .* \(in Tied\)"):
        select_targets(model, ("x*",), (), "mine")


def test_gradual_pruner_errors_name_it_without_editing_messages() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"^GradualPruner: the pattern 'enc\.\*' matches no"):
        prunekit.GradualPruner(model, 0.5, start_step=0, end_step=2, include="enc.*")


class Unused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_engine_errors_name_the_path_in_the_model_of_this_call() -> None:
    """The paths come with the call's plan: a module under another name in a second model
    is named as that model has it."""
    layer = nn.Linear(4, 4)
    first, second = Unused(), nn.Sequential(Unused())
    first.unused, second[0].unused = layer, layer
    include = ["used.weight", "unused.weight"]
    with pytest.raises(ValueError, match=r"'unused.weight', parameter 'weight' of Linear never"):
        prunekit.prune_model(first, 0.5, method="wanda", calibration=[torch.randn(2, 4)],
                             include=include)  # fmt: skip
    with pytest.raises(ValueError, match=r"'0.unused.weight', parameter 'weight' of Linear never"):
        prunekit.prune_model(second, 0.5, method="wanda", calibration=[torch.randn(2, 4)],
                             include=[f"0.{n}" for n in include])  # fmt: skip
    assert not prunekit.is_pruned(first) and not prunekit.is_pruned(second)


def test_the_old_methods_registry_warns_and_reads_the_one_registry() -> None:
    with pytest.warns(FutureWarning, match=r"prunekit.whole.registry.METHODS"):
        old = prunekit.methods.METHODS  # type: ignore[attr-defined]
    assert old == {name: METHODS[name].pruning for name in OFFLINE}
    with pytest.raises(AttributeError, match="no attribute 'NOPE'"):
        prunekit.methods.NOPE  # type: ignore[attr-defined]  # noqa: B018
