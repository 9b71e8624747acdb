"""Checkpoints: pruned state dicts into unpruned models, permanent exports, atomic files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit as prune
from helpers.model_state import bits, fingerprint
from helpers.pruned_models import hooks, mlp, state, train_step


def plain_mlp(seed: int = 9) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def test_load_into_an_unpruned_model_reinstalls_exact_masks() -> None:
    model = mlp()
    train_step(model, "mlp")
    fresh = plain_mlp()
    result = prune.load_pruned_state_dict(fresh, model.state_dict())
    assert result.missing_keys == result.unexpected_keys == []
    assert sorted(state(fresh)) == sorted(state(model))
    assert prune.is_pruned(fresh)
    x = torch.randn(4, 6)
    assert torch.equal(fresh(x), model(x))
    assert torch.equal(fresh[0].weight, fresh[0].weight_orig * fresh[0].weight_mask)
    # Pruning again composes with the loaded mask exactly as with the original history.
    for m in (model, fresh):
        prune.l1_unstructured(m[0], "weight", 0.4)
        prune.ln_structured(m[2], "weight", 1, n=1, dim=1)
    assert sorted(state(fresh)) == sorted(state(model))


def test_load_a_torch_pruned_state_dict() -> None:
    theirs = plain_mlp(1)
    torch_prune.l1_unstructured(theirs[0], "weight", 0.5)
    torch_prune.ln_structured(theirs[2], "weight", 0.5, n=2, dim=0)
    ours = plain_mlp(2)
    prune.load_pruned_state_dict(ours, theirs.state_dict())
    assert sorted(state(ours)) == sorted(state(theirs))
    x = torch.randn(3, 6)
    assert torch.equal(ours(x), theirs(x))


def test_plain_load_state_dict_of_a_pruned_checkpoint_fails_where_ours_works() -> None:
    """The problem being solved: torch's loader rejects the _orig/_mask keys."""
    model = mlp()
    with pytest.raises(RuntimeError, match="Unexpected key"):
        plain_mlp().load_state_dict(model.state_dict())
    prune.load_pruned_state_dict(plain_mlp(), model.state_dict())


def test_attention_checkpoint_reinstalls_through_the_parent() -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2)
    prune.l1_unstructured(mha, "out_proj.weight", 0.5)
    prune.l1_unstructured(mha, "in_proj_weight", 0.5)
    fresh = nn.MultiheadAttention(8, 2)
    prune.load_pruned_state_dict(fresh, mha.state_dict())
    assert sorted(hooks(fresh)) == [
        ("", "CustomFromMask", []),
        ("", "RefreshSubmodule", []),
        ("out_proj", "CustomFromMask", []),
    ]
    opt = torch.optim.SGD(fresh.parameters(), lr=0.1)
    x = torch.randn(3, 2, 8)
    for _ in range(3):
        opt.zero_grad()
        fresh(x, x, x)[0].sum().backward()
        opt.step()
    w = fresh.out_proj
    assert torch.equal(w.weight_orig.grad * (1 - w.weight_mask), torch.zeros_like(w.weight_mask))


def corrupt(sd: dict[str, torch.Tensor], how: str) -> dict[str, torch.Tensor]:
    sd = dict(sd)
    if how == "extra key":
        sd["2.extra"] = torch.ones(1)
    elif how == "missing key":
        del sd["2.bias"]
    elif how == "shape":
        sd["2.bias"] = torch.ones(4)
    elif how == "orig shape":
        sd["0.weight_orig"] = torch.ones(8, 5)
        sd["0.weight_mask"] = torch.ones(8, 5)
    elif how == "mask values":
        mask = sd["0.weight_mask"].clone()
        mask[0, 0] = 0.5
        sd["0.weight_mask"] = mask
    elif how == "no such submodule":
        sd["7.weight_orig"] = torch.ones(1)
        sd["7.weight_mask"] = torch.ones(1)
    return sd


@pytest.mark.parametrize(
    ("how", "kind", "word"),
    [
        ("extra key", RuntimeError, "'2.extra'"),
        ("missing key", RuntimeError, "'2.bias'"),
        ("shape", RuntimeError, "2.bias: saved (4,), model (3,)"),
        ("orig shape", RuntimeError, "0.weight_orig: saved (8, 5), model (8, 6)"),
        ("mask values", ValueError, "0.5"),
        ("no such submodule", RuntimeError, "'7'"),
    ],
)
def test_bad_checkpoint_leaves_the_model_as_it_was(
    how: str, kind: type[Exception], word: str
) -> None:
    sd = corrupt(mlp().state_dict(), how)
    for target in (plain_mlp(), mlp()):
        before = fingerprint(target)
        with pytest.raises(kind) as info:
            prune.load_pruned_state_dict(target, sd)
        assert word in str(info.value)
        assert "expected" in str(info.value)
        assert fingerprint(target) == before


def test_not_strict_skips_unknown_keys_and_reports_them() -> None:
    sd = corrupt(mlp().state_dict(), "extra key")
    del sd["2.bias"]
    fresh = plain_mlp()
    result = prune.load_pruned_state_dict(fresh, sd, strict=False)
    assert result.unexpected_keys == ["2.extra"]
    assert result.missing_keys == ["2.bias"]
    assert prune.is_pruned(fresh)


def test_permanent_state_dict_loads_into_a_plain_model_and_changes_nothing() -> None:
    model = mlp()
    train_step(model, "mlp")
    before = fingerprint(model)
    plain = prune.permanent_state_dict(model)
    assert fingerprint(model) == before
    assert set(plain) == set(plain_mlp().state_dict())
    for key in ("0.weight", "0.bias", "2.weight"):
        module = model.get_submodule(key.split(".")[0])
        name = key.split(".")[1]
        expected = getattr(module, name + "_orig") * getattr(module, name + "_mask")
        assert torch.equal(plain[key], expected)
    deployed = plain_mlp()
    deployed.load_state_dict(plain)
    x = torch.randn(5, 6)
    assert torch.equal(deployed(x), model(x))
    assert not prune.is_pruned(deployed)


def test_save_and_load_files(tmp_path: Path) -> None:
    model = mlp()
    path = tmp_path / "model.pt"
    prune.save_pruned(model, path)
    fresh = plain_mlp()
    prune.load_pruned(fresh, path)
    assert sorted(state(fresh)) == sorted(state(model))
    prune.save_pruned(model, tmp_path / "deploy.pt", permanent=True)
    deployed = plain_mlp()
    deployed.load_state_dict(torch.load(tmp_path / "deploy.pt", weights_only=True))
    x = torch.randn(2, 6)
    assert torch.equal(deployed(x), model(x))
    assert sorted(os.listdir(tmp_path)) == ["deploy.pt", "model.pt"]


def test_safetensors_files(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    model = mlp()
    prune.save_pruned(model, tmp_path / "model.safetensors")
    fresh = plain_mlp()
    prune.load_pruned(fresh, tmp_path / "model.safetensors")
    assert sorted(state(fresh)) == sorted(state(model))


def test_a_failed_save_keeps_the_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "model.pt"
    prune.save_pruned(mlp(), path)
    old = path.read_bytes()
    real_save = torch.save

    def half_then_fail(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        real_save(obj, f, *args, **kwargs)
        with open(f, "r+b") as handle:
            handle.truncate(10)
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_then_fail)
    model = plain_mlp()
    prune.l1_unstructured(model[0], "weight", 0.9)
    with pytest.raises(OSError, match="disk full"):
        prune.save_pruned(model, path)
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["model.pt"]


def test_bits_helper_tells_nan_payloads_apart() -> None:
    assert bits(torch.tensor([float("nan")])) == bits(torch.tensor([float("nan")]))
    assert bits(torch.tensor([0.0])) != bits(torch.tensor([-0.0]))


def test_an_integer_parameter_to_reinstall_is_named_by_its_path() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    model[0].weight = nn.Parameter(torch.ones(2, 2, dtype=torch.int64), requires_grad=False)
    before = fingerprint(model)
    saved = {"0.weight_orig": torch.ones(2, 2), "0.weight_mask": torch.ones(2, 2)}
    saved["0.bias"] = torch.ones(2)
    with pytest.raises(TypeError, match=r"^'0\.weight', parameter 'weight' of Linear has dtype"):
        prune.load_pruned_state_dict(model, saved)
    assert fingerprint(model) == before


def test_an_empty_path_is_refused_by_name_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^save_pruned: invalid path=''; expected a path"):
        prune.save_pruned(mlp(), "")
    assert list(tmp_path.iterdir()) == []
