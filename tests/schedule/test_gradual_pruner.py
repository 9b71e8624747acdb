"""GradualPruner: one mask per tensor, the scheduled sparsity, nothing revived, clean errors."""

from __future__ import annotations

import copy
import dataclasses
import io
import itertools
import pickle
import re
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
from helpers.gradual_models import Small, masks, train_step
from prunekit.schedule import GradualConfig

WEIGHTS = ("conv.weight", "fc1.weight", "fc2.weight")


def run(pruner: prune.GradualPruner, model: nn.Module, steps: int, **opt: float) -> list[dict]:
    """Train `steps` steps; the masks after each."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, **opt)
    seen = []
    for step in range(1, steps + 1):
        train_step(model, optimizer, step)
        pruner.step()
        seen.append(masks(model))
    return seen


def zeros(mask: torch.Tensor) -> int:
    return int((mask == 0).sum())


def test_one_hook_one_mask_per_tensor_however_many_updates() -> None:
    model = Small()
    pruner = prune.GradualPruner(model, 0.9, start_step=1, end_step=30)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    train_step(model, optimizer, 1)
    pruner.step()
    buffers = {n: model.get_buffer(n + "_mask") for n in WEIGHTS}
    for step in range(2, 31):
        train_step(model, optimizer, step)
        pruner.step()
    for name in WEIGHTS:
        module = model.get_submodule(name.split(".")[0])
        hooks = [
            h for h in module._forward_pre_hooks.values() if isinstance(h, prune.BasePruningMethod)
        ]
        assert len(hooks) == 1 and type(hooks[0]) is prune.Gradual
        assert model.get_buffer(name + "_mask") is buffers[name]  # rewritten in place
        assert hooks[0].mask is buffers[name]  # no second copy beside it
    assert pruner.amount == 0.9 and pruner.steps == 30
    rows = prune.report(model)
    assert [rows[n].method for n in WEIGHTS] == ["Gradual(L1, 0.9)"] * 3
    assert "Gradual(L1, 0.9)" in str(rows)
    assert rows["fc1.bias"].method is None


@pytest.mark.parametrize("method", ["l1", "random"])
def test_layer_scope_reaches_each_scheduled_amount_and_revives_nothing(method: str) -> None:
    model = Small()
    pruner = prune.GradualPruner(model, 0.8, start_step=2, end_step=12, every=3, method=method)
    history = run(pruner, model, 14, weight_decay=1e-3)
    for step, found in enumerate(history, 1):
        held = pruner.amount_at(max(s for s in (2, 5, 8, 11, 12, 0) if s <= step))
        for name in WEIGHTS:
            if step < 2:
                assert not found
                continue
            mask = found[name + "_mask"]
            assert zeros(mask) == round(held * mask.numel()), (step, name)
            if step > 2:
                before = history[step - 2][name + "_mask"]
                assert bool((mask <= before).all()), "an entry came back"


def test_each_update_prunes_the_smallest_alive_magnitudes() -> None:
    model = Small()
    pruner = prune.GradualPruner(model, 0.7, start_step=1, end_step=4, schedule="linear")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(1, 5):
        train_step(model, optimizer, step)
        old = {n: model.state_dict().get(n + "_mask") for n in WEIGHTS}
        values = {
            n: model.state_dict()[n + ("_orig" if old[n] is not None else "")].clone()
            for n in WEIGHTS
        }
        pruner.step()
        for name in WEIGHTS:
            alive = torch.ones_like(values[name]) if old[name] is None else old[name]
            want_pruned = round(pruner.amount * alive.numel())
            extra = want_pruned - zeros(alive)
            magnitudes = values[name].abs().masked_fill(alive == 0, float("inf")).flatten()
            expected = alive.clone().flatten()
            expected[magnitudes.argsort(stable=True)[:extra]] = 0
            assert torch.equal(model.get_buffer(name + "_mask").flatten(), expected)


def test_global_scope_is_global_unstructured_of_the_extra_entries() -> None:
    model = Small()
    pruner = prune.GradualPruner(model, 0.9, start_step=1, end_step=6, scope="global")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    total = sum(model.get_parameter(n).numel() for n in WEIGHTS)
    for step in range(1, 7):
        train_step(model, optimizer, step)
        twin = copy.deepcopy(model)
        pairs = [(twin.get_submodule(n.split(".")[0]), "weight") for n in WEIGHTS]
        done = sum(zeros(m) for m in masks(twin).values())
        prune.global_unstructured(
            pairs, prune.L1Unstructured, amount=round(pruner.amount_at(step) * total) - done
        )
        pruner.step()
        assert all(
            torch.equal(a, b)
            for a, b in zip(masks(model).values(), masks(twin).values(), strict=True)
        )
    assert sum(zeros(m) for m in masks(model).values()) == round(0.9 * total)
    assert prune.report(model)["fc1.weight"].method == "Gradual(L1 global, 0.9)"
    sparsities = sorted(prune.report(model)[n].sparsity for n in WEIGHTS)
    assert sparsities[0] < 0.9 < sparsities[-1]  # one ranking, unequal shares


@pytest.mark.parametrize(
    ("method", "pattern"), [("ln", "unstructured"), ("random", prune.Channels(dim=0))]
)
def test_channels_prune_whole_output_channels(method: str, pattern: Any) -> None:
    model = Small()
    pruner = prune.GradualPruner(
        model,
        0.5,
        start_step=1,
        end_step=5,
        pattern=pattern,
        method=method,
        include=("conv.weight", "fc1.weight"),
    )
    history = run(pruner, model, 6)
    for step, found in enumerate(history, 1):
        for name, channels in (("conv.weight", 6), ("fc1.weight", 24)):
            mask = found[name + "_mask"].flatten(1)
            rows = mask.sum(1)
            assert bool(((rows == 0) | (rows == mask.shape[1])).all())
            assert int((rows == 0).sum()) == round(pruner.amount_at(step) * channels)
    for early, late in itertools.pairwise(history):
        assert all(bool((late[k] <= early[k]).all()) for k in early)
    assert (
        prune.report(model)["conv.weight"].method
        == f"Gradual({'L2' if method == 'ln' else 'Random'} channels, 0.5)"
    )


def test_a_tensor_pruned_before_keeps_its_zeros_and_gets_one_container() -> None:
    model = Small()
    prune.l1_unstructured(model.fc1, "weight", amount=0.6)
    before = model.fc1.weight_mask.clone()
    pruner = prune.GradualPruner(model, 0.8, start_step=1, end_step=8, include="fc1.weight")
    history = run(pruner, model, 8)
    assert pruner.amount_at(1) == 0.0 and zeros(history[0]["fc1.weight_mask"]) == zeros(before)
    assert bool((history[-1]["fc1.weight_mask"] <= before).all())
    assert zeros(history[-1]["fc1.weight_mask"]) == round(0.8 * before.numel())
    assert prune.report(model)["fc1.weight"].method == "L1Unstructured(0.6)+Gradual(L1, 0.8)"


@pytest.mark.parametrize("scope", ["layer", "global"])
def test_per_row_brings_every_row_to_the_scheduled_sparsity(scope: str) -> None:
    """PerRow counts per row: an update asks each row for its share, not for the tensor's
    whole count from every row (171 of each 256-entry row at 1/6, instead of 43)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 4, bias=False), nn.Linear(4, 8, bias=False))
    pruner = prune.GradualPruner(
        model, 0.5, start_step=1, end_step=4, schedule="linear", pattern=prune.PerRow(),
        scope=scope,
    )  # fmt: skip
    for step in range(1, 5):
        pruner.step()
        for layer in model:
            row = layer.weight.shape[1]
            pruned = (layer.weight_mask == 0).sum(1).tolist()
            assert pruned == [round(pruner.amount_at(step) * row)] * layer.weight.shape[0]


def test_nm_prunes_at_its_own_sparsity_and_refuses_others() -> None:
    """N:M has one sparsity, (m - n) / m: a schedule holding it gives the N:M mask (also over
    entries pruned before); one asking for another sparsity is an error naming both. A
    built-in schedule is refused when the pruner is made (test_gradual_nm_timetable.py);
    a callable's values are known only at the step, which refuses them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8, bias=False))
    prune.l1_unstructured(model[0], "weight", 0.3)
    before = model[0].weight_mask.clone()
    pruner = prune.GradualPruner(
        model, 0.5, start_step=1, end_step=3, schedule="constant", pattern=prune.NM(2, 4)
    )
    pruner.step()
    groups = model[0].weight_mask.reshape(-1, 4)
    assert int(groups.sum(1).max()) <= 2 and pruner.amount == 0.5
    assert torch.equal(groups.sum(1), before.reshape(-1, 4).sum(1).clamp(max=2))
    assert bool((model[0].weight_mask <= before).all())
    other = prune.GradualPruner(
        nn.Linear(16, 8), 0.5, start_step=1, end_step=3, schedule=lambda step: 0.25 * (step - 1),
        pattern=prune.NM(2, 4),
    )  # fmt: skip
    other.step()
    with pytest.raises(ValueError, match=r"NM\(2, 4\) prunes 0\.5 .* scheduled sparsity 0\.25"):
        other.step()
    assert other.steps == 1 and other.amount == 0.0


def test_start_step_zero_prunes_when_made() -> None:
    model = Small()
    pruner = prune.GradualPruner(model, 0.9, start_step=0, end_step=10, initial_amount=0.5)
    assert pruner.amount == 0.5
    assert zeros(model.fc1.weight_mask) == round(0.5 * model.fc1.weight.numel())
    later = Small()
    prune.GradualPruner(later, 0.9, start_step=1, end_step=10, initial_amount=0.5)
    assert not prune.is_pruned(later)


def test_the_forward_sees_each_new_mask_and_module_weight_is_current() -> None:
    model = Small()
    pruner = prune.GradualPruner(model, 0.9, start_step=1, end_step=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in (1, 2):
        train_step(model, optimizer, step)
        pruner.step()
        want = model.fc1.weight_orig * model.fc1.weight_mask
        assert torch.equal(model.fc1.weight, want)  # refreshed before any forward
        x = torch.randn(2, 1, 6, 6)
        with torch.no_grad():
            out = model(x)
        plain = Small()
        plain.load_state_dict(prune.permanent_state_dict(model))
        assert torch.equal(out, plain(x))


def test_random_is_seeded_by_the_pruner_and_leaves_torch_rng_alone() -> None:
    def final_masks(seed: int) -> tuple[dict, torch.Tensor]:
        torch.manual_seed(5)
        model = Small()
        pruner = prune.GradualPruner(
            model, 0.9, start_step=1, end_step=3, method="random", seed=seed
        )
        for _ in range(3):
            pruner.step()
        return masks(model), torch.rand(3)

    a, after_a = final_masks(1)
    b, after_b = final_masks(1)
    c, _ = final_masks(2)
    torch.manual_seed(5)
    Small()
    assert torch.equal(after_a, torch.rand(3))  # the pruner drew nothing from torch's RNG
    assert torch.equal(after_a, after_b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_pruned_model_copies_and_pickles_with_one_mask() -> None:
    model = Small()
    pruner = prune.GradualPruner(model, 0.5, start_step=1, end_step=1)
    run(pruner, model, 1)
    twin = copy.deepcopy(model)
    hook = next(h for h in twin.fc1._forward_pre_hooks.values() if isinstance(h, prune.Gradual))
    assert hook.mask is twin.fc1.weight_mask
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    hook = next(h for h in loaded.fc1._forward_pre_hooks.values() if isinstance(h, prune.Gradual))
    assert hook.mask is loaded.fc1.weight_mask
    assert prune.report(loaded)["fc1.weight"].method == "Gradual(L1, 0.5)"
    assert pickle.loads(pickle.dumps(model)).fc1.weight_mask.sum() == model.fc1.weight_mask.sum()


def test_rewind_puts_weights_back_and_keeps_masks() -> None:
    model = Small()
    start = copy.deepcopy(model.state_dict())
    pruner = prune.GradualPruner(model, 0.8, start_step=1, end_step=3, scope="global")
    run(pruner, model, 3)
    kept = masks(model)
    pruner.rewind(start)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in kept.items())
    for name in WEIGHTS:
        assert torch.equal(model.get_parameter(name + "_orig"), start[name])
        assert torch.equal(
            model.get_submodule(name.split(".")[0]).weight, start[name] * kept[name + "_mask"]
        )
    assert torch.equal(model.fc1.bias, start["fc1.bias"])
    with pytest.raises(RuntimeError, match="Missing key"):
        pruner.rewind({k: v for k, v in start.items() if k != "fc2.bias"})


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        ({"pattern": "channels"}, {"method": "ln"}, "pattern='channels' .* write method='ln'"),
        ({"method": "magnitude"}, {"method": "l1"}, "method='magnitude' is named 'l1'"),
        (
            {"pattern": "channels", "method": "random"},
            {"pattern": prune.Channels(dim=0, norm=2), "method": "random"},
            r"write pattern=prunekit.Channels\(dim=0, norm=2\)",
        ),
    ],
)
def test_old_spellings_warn_and_prune_alike(
    old: dict[str, Any], new: dict[str, Any], words: str
) -> None:
    """GradualPruner speaks whole.Config's vocabulary; its old spellings still work, each
    with a FutureWarning naming the new one, and give the same masks and label."""
    found = []
    for kwargs in (old, new):
        torch.manual_seed(0)
        model = Small()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pruner = prune.GradualPruner(model, 0.5, start_step=1, end_step=3, seed=0, **kwargs)
            run(pruner, model, 3)
        futures = [str(w.message) for w in caught if w.category is FutureWarning]
        found.append((model.state_dict(), pruner.label, futures))
    (state, label, warned), (want, want_label, none) = found
    assert label == want_label and not none and len(warned) == 1
    assert re.search(words, warned[0])
    assert state.keys() == want.keys()
    assert all(torch.equal(state[k], want[k]) for k in want)


@pytest.mark.parametrize(
    "kw, error, words",
    [
        ({"method": "l2"}, ValueError, "method='l2'; expected one of 'l1', 'random', 'ln'"),
        ({"method": "wanda"}, ValueError, "method='wanda'; expected one of 'l1', 'random'"),
        ({"pattern": "rows"}, ValueError, "pattern='rows'; expected 'unstructured', 'row'"),
        ({"method": "ln", "pattern": "row"}, ValueError, "method='ln' prunes whole output"),
        ({"scope": "model"}, ValueError, "scope='model'; expected 'layer'"),
        ({"scope": "global", "method": "ln"}, ValueError, "so scope must be 'layer'"),
        ({"method": "ln", "include": "conv.bias"}, ValueError, "(conv.bias): pattern="),
        ({"include": "enc*"}, ValueError, "the pattern 'enc*' matches no floating-point tensor"),
        ({"exclude": ["*"]}, ValueError, "no tensor left to prune after include/exclude"),
        ({"include": 3}, TypeError, "include=3; expected globs"),
        ({"seed": 1.5}, TypeError, "seed=1.5 of type float; expected an int in"),
        ({"seed": 2**64}, ValueError, "seed=18446744073709551616, out of range; expected an int"),
        ({"start_step": 5, "end_step": 2}, ValueError, "end_step=2 is before start_step=5"),
    ],
)
def test_bad_arguments(kw: dict, error: type[Exception], words: str) -> None:
    args = {"start_step": 0, "end_step": 4, **kw}
    model = Small()
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(error, match=r"^GradualPruner") as caught:
        prune.GradualPruner(model, 0.5, **args)
    assert words in str(caught.value)
    assert not prune.is_pruned(model) and all(
        torch.equal(v, state[k]) for k, v in model.state_dict().items()
    )


def test_bad_model() -> None:
    with pytest.raises(TypeError, match=r"invalid model of type dict; expected a torch nn\.Module"):
        prune.GradualPruner({}, 0.5, start_step=0, end_step=1)  # type: ignore[arg-type]


def test_a_tied_parameter_is_ranked_once_and_masked_under_each_name() -> None:
    tied = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6))
    tied[2].weight = tied[0].weight
    pruner = prune.GradualPruner(tied, 0.5, start_step=1, end_step=2, scope="global")
    assert [t.name for t in pruner.targets] == ["0.weight"]
    for _ in range(2):
        pruner.step()
    assert torch.equal(tied[0].weight_mask, tied[2].weight_mask)
    assert zeros(tied[0].weight_mask) == 18
    assert tied[0].weight_orig is tied[2].weight_orig
    x = torch.randn(3, 6)
    assert torch.equal(tied(x), tied[2](torch.relu(tied[0](x))))
    assert torch.equal(tied[2].weight, tied[0].weight_orig * tied[0].weight_mask)


def test_attention_out_proj_is_pruned_through_the_attention() -> None:
    mha = nn.MultiheadAttention(8, 2)
    pruner = prune.GradualPruner(mha, 0.75, start_step=1, end_step=3)
    assert [t.name for t in pruner.targets] == ["in_proj_weight", "out_proj.weight"]
    optimizer = torch.optim.SGD(mha.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(5, 2, 8)
    for _ in range(4):
        optimizer.zero_grad()
        mha(x, x, x)[0].sum().backward()
        optimizer.step()
        pruner.step()
    out = mha.out_proj
    assert zeros(out.weight_mask) == 48
    assert bool((out.weight[out.weight_mask == 0] == 0).all())
    plain = nn.MultiheadAttention(8, 2)
    plain.load_state_dict(prune.permanent_state_dict(mha))
    with torch.no_grad():
        assert torch.equal(mha(x, x, x)[0], plain(x, x, x)[0])


def test_a_failed_update_changes_nothing() -> None:
    model = Small()
    pruner = prune.GradualPruner(model, 0.9, start_step=1, end_step=3, scope="global")
    pruner.step()
    with torch.no_grad():
        model.fc2.weight_orig[0, 0] = float("nan")
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"GradualPruner \(fc2.weight\): its values hold nan"):
        pruner.step()
    assert all(
        torch.equal(
            v,
            state[k],
        )
        or k == "fc2.weight_orig"
        for k, v in model.state_dict().items()
    )
    assert pruner.amount == pruner.amount_at(1)
    fresh = Small()
    fresh.fc1.weight.data[0, 0] = float("inf")
    layer = prune.GradualPruner(fresh, 0.9, start_step=1, end_step=3, initial_amount=0.2)
    with pytest.raises(ValueError, match=r"^GradualPruner \(fc1.weight\): its values hold inf"):
        layer.step()
    assert not prune.is_pruned(fresh)  # conv was fine, but nothing is half-installed


def test_a_mask_made_permanent_midway_is_an_error() -> None:
    model = Small()
    pruner = prune.GradualPruner(model, 0.9, start_step=1, end_step=3)
    pruner.step()
    prune.remove(model.fc1, "weight")
    with pytest.raises(ValueError, match=r"\(fc1.weight\) lost its mask"):
        pruner.step()


def test_import_prunekit_imports_no_trainer_library(imported_by: dict[str, frozenset[str]]) -> None:
    assert (
        sorted(
            imported_by["prunekit.schedule"] & {"transformers", "pytorch_lightning", "lightning"}
        )
        == []
    )


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"method": "random", "scope": "global", "schedule": "linear", "every": 2},
        {"method": "ln", "initial_amount": 0.1, "exclude": ("fc2.*",)},
        {"pattern": "row", "include": ("conv",)},
    ],
)
def test_a_config_is_the_keywords_in_one_object(kw: dict[str, Any]) -> None:
    """``config=GradualConfig(...)`` prunes as the same keywords do, bit for bit."""
    found = []
    for make in (
        lambda m: prune.GradualPruner(m, 0.6, start_step=1, end_step=5, seed=3, **kw),
        lambda m: prune.GradualPruner(
            m, config=GradualConfig(0.6, start_step=1, end_step=5, seed=3, **kw)
        ),
    ):
        torch.manual_seed(0)
        model = Small()
        pruner = make(model)
        run(pruner, model, 5)
        found.append((model.state_dict(), pruner.label, pruner.state_dict()["setup"]))
    (state, label, setup), (want, want_label, want_setup) = found
    assert (label, setup) == (want_label, want_setup)
    assert state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in want)


@pytest.mark.parametrize(
    ("args", "kw", "words"),
    [
        ((0.5,), {"config": GradualConfig(0.5, 0, 2)}, "config= is given with final_amount"),
        ((), {"config": GradualConfig(0.5, 0, 2), "seed": 1}, "config= is given with seed"),
        ((), {"config": {"final_amount": 0.5}}, "invalid config of type dict"),
        ((0.5,), {"start_step": 0}, "missing end_step"),
        ((), {}, "missing final_amount and start_step and end_step"),
        (
            (0.5,),
            {"start_step": 0, "end_step": 2, "every_step": 1},
            "unexpected keyword every_step=",
        ),
    ],
)
def test_bad_calls(args: tuple[Any, ...], kw: dict[str, Any], words: str) -> None:
    with pytest.raises(TypeError, match=r"^GradualPruner: " + re.escape(words)):
        prune.GradualPruner(Small(), *args, **kw)


def test_a_config_is_checked_when_made_and_speaks_the_new_names() -> None:
    with pytest.raises(ValueError, match=r"^GradualPruner: invalid scope='model'"):
        GradualConfig(0.5, 0, 2, scope="model")
    with pytest.warns(FutureWarning) as caught:
        config = GradualConfig(0.5, 0, 2, pattern="channels", method="magnitude", include="fc")
    told = [str(w.message) for w in caught]
    assert len(told) == 2 and "'magnitude' is named 'l1'" in told[0] and "method='ln'" in told[1]
    assert all(w.filename == __file__ for w in caught)  # the user's line, not the dataclass's
    assert (config.method, config.pattern, config.include) == ("ln", "unstructured", ("fc",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # checked once: a config made again warns of nothing
        assert dataclasses.replace(config, seed=1).method == "ln"
