"""prunekit.io.statedict: pruning a state_dict's tensors without the model, against torch."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from prunekit.io.files import save_state_dict
from prunekit.io.statedict import entries, prune_file, prune_state_dict
from prunekit.tools.cli import main
from prunekit.whole import Config
from prunekit.whole.targets import select_names


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 3))


def _state() -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in _model().state_dict().items()}


WEIGHTS = ["0.weight", "3.weight"]


def test_entries_pair_orig_and_mask() -> None:
    model = _model()
    torch_prune.l1_unstructured(model[3], "weight", amount=0.5)
    found = {e.name: e for e in entries(model.state_dict())}
    assert found["3.weight"].mask is not None
    assert torch.equal(found["3.weight"].tensor, model[3].weight_orig)
    assert "3.weight_mask" not in found and "3.weight_orig" not in found
    assert found["3.bias"].mask is None


def test_select_defaults_to_floating_tensors_of_two_dims_or_more() -> None:
    found = entries(_state())
    assert select_names(found) == WEIGHTS
    assert select_names(found, include=["*.bias"]) == ["0.bias", "1.bias", "3.bias"]
    assert select_names(found, exclude=["3.*"]) == ["0.weight"]


@pytest.mark.parametrize(
    ("include", "exclude", "message"),
    [
        (["conv*"], [], "the pattern 'conv\\*' matches no floating-point tensor"),
        ([], ["nope"], "the pattern 'nope' matches no"),
        ([], ["*.weight"], "no tensor left to prune"),
        (["1.num_batches_tracked"], [], "matches no floating-point tensor"),
    ],
)
def test_select_errors(include: list[str], exclude: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        select_names(entries(_state()), include, exclude)


def test_l1_matches_torch_per_tensor() -> None:
    state = _state()
    result = prune_state_dict(state, 0.6, method="l1")
    model = _model()
    for module in (model[0], model[3]):
        torch_prune.l1_unstructured(module, "weight", amount=0.6)
        torch_prune.remove(module, "weight")
    for key, value in model.state_dict().items():
        assert torch.equal(result.state[key], value), key
    assert result.pruned == WEIGHTS


def test_global_matches_torch() -> None:
    result = prune_state_dict(_state(), 50, method="l1", global_pruning=True, keep_masks=True)
    model = _model()
    pairs = [(model[0], "weight"), (model[3], "weight")]
    torch_prune.global_unstructured(pairs, torch_prune.L1Unstructured, amount=50)
    expected = model.state_dict()
    assert sorted(result.state) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(result.state[key], value), key
        assert result.state[key].dtype == value.dtype


def test_ln_matches_torch() -> None:
    result = prune_state_dict(_state(), 2, method="ln", n=1, dim=1, include=["3.weight"])
    model = _model()
    torch_prune.ln_structured(model[3], "weight", amount=2, n=1, dim=1)
    assert torch.equal(result.state["3.weight"], model[3].weight)
    assert torch.equal(result.state["0.weight"], model[0].weight)  # not included


def test_masks_in_the_input_are_resumed() -> None:
    model = _model()
    torch_prune.l1_unstructured(model[3], "weight", amount=0.5)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    result = prune_state_dict(saved, 0.5, method="l1", include=["3.weight"], keep_masks=True)
    torch_prune.l1_unstructured(model[3], "weight", amount=0.5)
    assert torch.equal(result.state["3.weight_mask"], model[3].weight_mask)
    assert int((result.state["3.weight_mask"] == 0).sum()) == 24 + 12
    permanent = prune_state_dict(saved, 0.5, method="l1", include=["0.weight"])
    assert "3.weight_mask" not in permanent.state  # the old mask is made permanent too
    assert torch.equal(permanent.state["3.weight"], saved["3.weight_orig"] * saved["3.weight_mask"])


def test_the_input_is_not_changed() -> None:
    state = _state()
    copy = {k: v.clone() for k, v in state.items()}
    prune_state_dict(state, 0.9, method="l1")
    prune_state_dict(state, 0.9, method="random", global_pruning=True, seed=1)
    for key, value in copy.items():
        assert torch.equal(state[key], value)


def test_random_is_reproducible_with_a_seed_and_leaves_the_global_generator() -> None:
    state = _state()
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first = prune_state_dict(state, 0.5, method="random", seed=7)
    second = prune_state_dict(state, 0.5, method="random", seed=7)
    other = prune_state_dict(state, 0.5, method="random", seed=8)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(first.state["3.weight"], second.state["3.weight"])
    assert not torch.equal(first.state["3.weight"], other.state["3.weight"])
    assert int((first.state["3.weight"] == 0).sum()) == 24


@pytest.mark.parametrize(
    ("method", "amount", "options", "error", "message"),
    [
        ("l2", 0.5, {}, ValueError, "invalid method='l2'; expected one of l1, random, ln"),
        ("l1", 1.5, {}, ValueError, "invalid amount=1.5"),
        ("l1", True, {}, TypeError, "invalid amount=True"),
        ("l1", 0.5, {"n": 2}, ValueError, "n and dim apply to method 'ln' only"),
        ("ln", 0.5, {"global_pruning": True}, ValueError, "use method 'l1' or 'random'"),
        ("ln", 0.5, {"include": ["3.bias"]}, ValueError, "tensor '3.bias': .*2 or more dims"),
        ("ln", 0.5, {"dim": 4}, IndexError, "tensor '0.weight': .*dim=4 is out of range"),
        ("l1", 100, {}, ValueError, "amount=100 is more than the 72"),
        ("ln", 0.5, {"n": -1}, ValueError, "invalid norm order n=-1"),
    ],
)
def test_errors(
    method: str, amount: float, options: dict[str, object], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        prune_state_dict(_state(), amount, method=method, **options)  # type: ignore[arg-type]


def test_a_bad_saved_mask_is_named() -> None:
    state = {"w_orig": torch.ones(2, 2), "w_mask": torch.full((2, 2), 0.5)}
    with pytest.raises(
        ValueError,
        match=r"tensor 'w': the mask holds 4 value\(s\) other than 0 and 1",
    ):
        prune_state_dict(state, 0.5, method="l1")


@pytest.mark.parametrize("extra", [{}, {"fc.weight": torch.ones(3, 3)}])
def test_a_mask_without_its_orig_is_not_pruned_as_a_weight(extra: dict[str, torch.Tensor]) -> None:
    state = {**extra, "fc.weight_mask": torch.ones(3, 3), "fc.bias": torch.ones(3)}
    copies = {k: v.clone() for k, v in state.items()}
    with pytest.raises(ValueError, match=r"'fc.weight_mask' is named as the mask of a pruned "):
        prune_state_dict(state, 0.5, method="l1")
    assert all(torch.equal(state[k], copies[k]) for k in copies)
    if extra:
        done = prune_state_dict(state, 0.5, method="l1", exclude=["fc.weight_mask"])
        assert done.pruned == ["fc.weight"]
        assert torch.equal(done.state["fc.weight_mask"], copies["fc.weight_mask"])


def test_a_mask_without_its_orig_is_refused_by_the_cli(tmp_path: Path) -> None:
    path = save_state_dict({"fc.weight_mask": torch.ones(3, 3)}, tmp_path / "m.safetensors")
    out = tmp_path / "out.safetensors"
    assert main(["prune", str(path), "-o", str(out), "--amount", "0.5"]) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    ("method", "amount", "options"),
    [
        ("l1", 0.4, {}),
        ("l1", 7, {"scope": "global"}),
        ("random", 0.5, {"seed": 3}),
        ("random", 0.3, {"seed": 4, "scope": "global"}),
        ("ln", 1, {"n": 1, "dim": 1}),
        ("ln", 0.5, {}),
    ],
)
def test_the_masks_are_the_ones_a_models_parameters_get(
    method: str, amount: float, options: dict[str, object]
) -> None:
    """Tensors ranked as plain tensors get the masks prunekit gives a model's parameters,
    bit for bit: saved masks resumed, ties (integer values) broken alike, the same draws."""
    import prunekit

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 4))
    with torch.no_grad():
        model[1].weight.copy_(torch.randint(-2, 3, (4, 8)).float())  # many ties
    prunekit.random_unstructured(model[0], "weight", amount=0.25)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = prune_state_dict(state, amount, method=method, keep_masks=True, **options)  # type: ignore[arg-type]
    pairs = [(model[0], "weight"), (model[1], "weight")]
    seed = options.get("seed")
    with torch.random.fork_rng(devices=[]):
        if isinstance(seed, int):
            torch.manual_seed(seed)
        if options.get("scope") == "global":
            cls = {"l1": prunekit.L1Unstructured, "random": prunekit.RandomUnstructured}[method]
            prunekit.global_unstructured(pairs, cls, amount=amount)
        else:
            for module, name in pairs:
                if method == "ln":
                    n, dim = options.get("n", 2), options.get("dim", 0)
                    prunekit.ln_structured(module, name, amount=amount, n=n, dim=dim)
                else:
                    pruning = {
                        "l1": prunekit.l1_unstructured,
                        "random": prunekit.random_unstructured,
                    }
                    pruning[method](module, name, amount=amount)
    for key, value in model.state_dict().items():
        assert torch.equal(result.state[key], value), key
        assert result.state[key].dtype == value.dtype, key


@pytest.mark.parametrize(
    ("amount", "options"),
    [
        (0.6, {}),
        (50, {"scope": "global"}),
        (0.5, {"method": "random", "scope": "global"}),
        (2, {"method": "ln", "n": 1, "dim": 1, "include": ("3.weight",)}),
        (0.7, {"include": ("0",), "exclude": ("3.*",)}),
    ],
)
def test_a_config_is_the_keywords_in_one_object(amount: float, options: dict[str, Any]) -> None:
    """``config=Config(...)`` prunes as the same keywords do, bit for bit."""
    torch.manual_seed(5)
    want = prune_state_dict(_state(), amount, keep_masks=True, seed=2, **options)
    config = Config(amount=amount, **options)
    got = prune_state_dict(_state(), config=config, keep_masks=True, seed=2)
    assert want.pruned == got.pruned and list(want.state) == list(got.state)
    assert all(torch.equal(want.state[k], got.state[k]) for k in want.state)


def test_the_method_first_still_works_with_a_future_warning() -> None:
    want = prune_state_dict(_state(), 0.5, method="random", seed=3).state
    with pytest.warns(FutureWarning, match=r"prune_state_dict: the method as a positional"):
        old = prune_state_dict(_state(), "random", 0.5, seed=3).state  # type: ignore[arg-type]
    with pytest.warns(FutureWarning, match=r"write prune_state_dict\(\.\.\., 0\.5, method="):
        mixed = prune_state_dict(_state(), "random", amount=0.5, seed=3).state
    for got in (old, mixed):
        assert all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((0.5,), {"config": Config(amount=0.5)}, TypeError, r"config= is given with 0\.5"),
        ((), {"config": Config(amount=0.5), "scope": "global"}, TypeError, "scope="),
        ((), {"config": {"amount": 0.5}}, TypeError, "invalid config of type dict"),
        ((), {"method": "l1"}, TypeError, "prune_state_dict: missing the amount"),
        ((0.5,), {"global": True}, TypeError, "prune_state_dict: unexpected keyword global="),
        ((0.5, 0.2), {}, TypeError, "takes the amount as its one positional argument"),
        (("l1", 0.5), {"method": "l1"}, TypeError, "got the method twice"),
        ((0.5,), {"amount": 0.5}, TypeError, "got the amount twice"),
        ((), {"config": Config(amount=0.5, method="wanda")}, ValueError, "'wanda'; exp"),
        ((), {"config": Config(amount=0.5, pattern="row")}, ValueError, "^prune_state_dict: inv"),
        ((0.5,), {"n": 2}, ValueError, "prune_state_dict: n and dim apply to method 'ln' only"),
        ((0.5,), {"method": "ln", "dim": "0"}, TypeError, "prune_state_dict: invalid dim='0'"),
    ],
)
def test_bad_calls(
    args: tuple[object, ...], kwargs: dict[str, object], error: type, message: str
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(error, match=message):
            prune_state_dict(_state(), *args, **kwargs)  # type: ignore[arg-type]


def test_the_old_keywords_still_work_and_a_config_made_by_hand_is_named() -> None:
    want = prune_state_dict(_state(), 0.5, method="l1").state
    got = prune_state_dict(_state(), method="l1", amount=0.5).state
    assert all(torch.equal(want[k], got[k]) for k in want)
    with pytest.raises(ValueError, match=r"^Config: invalid scope='model'"):
        Config(amount=0.5, scope="model")


def test_prune_file_takes_a_config(tmp_path: Path) -> None:
    source = save_state_dict(_state(), tmp_path / "in.safetensors")
    config = Config(method="ln", amount=1, n=1)
    done = prune_file(source, tmp_path / "out.safetensors", config=config, keep_masks=True)
    want = prune_state_dict(_state(), 1, method="ln", n=1, keep_masks=True)
    assert done.pruned == want.pruned
    assert all(torch.equal(done.state[k], want.state[k]) for k in want.state)


def test_an_empty_out_is_refused_by_name_before_the_input_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Path('') is the current folder; it was refused only as '.: is a directory'."""
    source = save_state_dict(_state(), tmp_path / "in.pt")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    with pytest.raises(ValueError, match=r"^prune_file: invalid out=''; expected a path"):
        prune_file(source, "", 0.5)
    with pytest.raises(ValueError, match=r"^prune_file: invalid out=''"):
        prune_file(tmp_path / "missing.pt", "", 0.5)  # before the input is read
    assert list((tmp_path / "here").iterdir()) == []


def _tied_state() -> dict[str, torch.Tensor]:
    """A state_dict of a model whose head is its embedding's Parameter: the two names hold
    one tensor (as torch.save keeps them, one storage)."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"emb": nn.Embedding(10, 8), "fc": nn.Linear(8, 8, bias=False)})
    model["head"] = nn.Linear(8, 10, bias=False)
    model["head"].weight = model["emb"].weight
    return model.state_dict()


@pytest.mark.parametrize(
    ("method", "amount", "scope"),
    [("random", 0.5, "layer"), ("random", 0.5, "global"), ("l1", 41, "global")],
)
def test_tied_tensors_get_one_mask(method: str, amount: float, scope: str) -> None:
    """'random' drew a mask for each name of a tied tensor, so its copies came out
    different (and a global count took its entries twice): one mask is drawn for the
    tensor and applied to every name of it, as prune_model masks a tied Parameter once."""
    state = _tied_state()
    assert state["emb.weight"].data_ptr() == state["head.weight"].data_ptr()
    result = prune_state_dict(state, amount, method=method, scope=scope, seed=0)
    emb, head, fc = (result.state[k] for k in ("emb.weight", "head.weight", "fc.weight"))
    assert torch.equal(emb, head)
    zeros = int((emb == 0).sum())
    if scope == "layer":
        assert zeros == 40 and int((fc == 0).sum()) == 32
    else:  # the tied tensor's 80 entries count once among the 80 + 64
        wanted = amount if isinstance(amount, int) else round(amount * (80 + 64))
        assert zeros + int((fc == 0).sum()) == wanted
    with torch.random.fork_rng(devices=[]):  # the masks prune_model gives the model
        torch.manual_seed(0)
        model = nn.ModuleDict({"emb": nn.Embedding(10, 8), "fc": nn.Linear(8, 8, bias=False)})
        model["head"] = nn.Linear(8, 10, bias=False)
        model["head"].weight = model["emb"].weight
        torch.manual_seed(0)
        import prunekit

        prunekit.prune_model(model, amount, method=method, scope=scope, keep_masks=False)
    for key, value in model.state_dict().items():
        assert torch.equal(result.state[key], value), key


def test_a_tied_tensor_is_written_once_and_read_back_equal(tmp_path: Path) -> None:
    """prune_file with --method random: the tied copies of a torch.save file stay equal."""
    save_state_dict(_tied_state(), tmp_path / "in.pt")
    assert main(["prune", str(tmp_path / "in.pt"), "-o", str(tmp_path / "out.pt"),
                 "--method", "random", "--amount", "0.5", "--seed", "1"]) == 0  # fmt: skip
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert torch.equal(out["emb.weight"], out["head.weight"])
    assert int((out["emb.weight"] == 0).sum()) == 40
    assert out["emb.weight"].data_ptr() == out["head.weight"].data_ptr()  # still one tensor
