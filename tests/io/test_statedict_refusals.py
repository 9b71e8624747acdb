"""The refusals of the state_dict entry points (prune_state_dict, prune_file, prune_sharded,
``prunekit prune``) name the entry point, the parameter and its bad value, say what is
allowed, as prune_model's do, and come before anything is written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import prunekit
from prunekit.io.files import save_state_dict
from prunekit.io.sharded import prune_sharded
from prunekit.io.statedict import prune_file, prune_state_dict
from prunekit.tools.cli import main
from prunekit.whole import Config

LN_GLOBAL = (
    r"method='ln' prunes whole output channels by their L-n norm, each tensor on its own, so "
    r"scope must be 'layer', not scope='global'; for scope='global' use method 'l1' or 'random'"
)


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    return {k: v.clone() for k, v in model.state_dict().items()}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sharded(folder: Path) -> Path:
    from safetensors.torch import save_file

    folder.mkdir()
    state = _state()
    save_file(state, str(folder / "model-1.safetensors"))
    index = {"weight_map": dict.fromkeys(state, "model-1.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "ln", "scope": "global"}, LN_GLOBAL),
        ({"method": "l2"}, r"invalid method='l2'; expected one of l1, random, ln"),
        ({"method": "wanda"}, r"invalid method='wanda'; expected one of l1, .*: prune_model"),
        ({"config": Config(method="taylor", amount=0.5)}, r"invalid method='taylor'; expected"),
        ({"config": Config(method="ln", amount=0.5, scope="global")}, LN_GLOBAL),
        ({"config": Config(method="l1", amount=0.5, sequential=True)},
         r"sequential=True applies to the calibrated methods \(wanda, sparsegpt, taylor\) "
         r"only, not method='l1', which would ignore it; expected no sequential \(None\)"),
        ({"config": Config(method="random", amount=0.5, progress=False)},
         r"progress=False applies to the calibrated methods .* not method='random'"),
    ],
)  # fmt: skip
def test_every_entry_point_names_itself_and_writes_nothing(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    state = _state()
    args = () if "config" in kwargs else (0.5,)
    with pytest.raises(ValueError, match="^prune_state_dict: " + message):
        prune_state_dict(state, *args, **kwargs)  # type: ignore[arg-type]
    source = save_state_dict(state, tmp_path / "in.pt")
    out = save_state_dict({"earlier": torch.ones(2)}, tmp_path / "out.pt")
    before = _digest(out)
    with pytest.raises(ValueError, match="^prune_file: " + message):
        prune_file(source, out, *args, **kwargs)  # type: ignore[arg-type]
    assert _digest(out) == before
    folder = _sharded(tmp_path / "sharded")
    with pytest.raises(ValueError, match="^prune_sharded: " + message):
        prune_sharded(folder, tmp_path / "sharded-out", *args, **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "sharded-out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.pt", "out.pt", "sharded"]


def test_the_model_and_the_state_dict_refuse_ln_globally_alike() -> None:
    model = nn.Sequential(nn.Linear(6, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"^prune_model: method='ln' prunes whole") as got:
        prunekit.prune_model(model, 0.5, method="ln", scope="global")
    takers = "'l1', 'random', 'wanda', 'sparsegpt' or 'taylor'"
    assert str(got.value).endswith(f"for scope='global' use method {takers}")
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("folder", [False, True])
def test_the_command_line_names_the_method_and_the_scope(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], folder: bool
) -> None:
    source = save_state_dict(_state(), tmp_path / "model.safetensors")
    path: Path = _sharded(tmp_path / "sharded") if folder else source
    out = tmp_path / ("out" if folder else "out.pt")
    if folder:
        out.mkdir()
        (out / "earlier.txt").write_text("an earlier output")
    else:
        out.write_bytes(b"an earlier output")
    argv = ["prune", str(path), "-o", str(out), "--method", "ln", "--scope", "global"]
    code = main([*argv, "--amount", "0.5"])
    _, err = capsys.readouterr()
    owner = "prune_sharded" if folder else "prune_file"
    assert code == 1
    assert err.startswith(f"prunekit prune: error: {owner}: method='ln' prunes"), err
    assert "not scope='global'; for scope='global' use method 'l1' or 'random'" in err
    if folder:
        assert [p.name for p in out.iterdir()] == ["earlier.txt"]
    else:
        assert out.read_bytes() == b"an earlier output"


def _tied() -> dict[str, torch.Tensor]:
    """A state_dict as torch.save keeps a model whose head shares the embedding's weight."""
    torch.manual_seed(0)
    shared = torch.randn(8, 4)
    return {"embed.weight": shared, "mid.weight": torch.randn(4, 4), "head.weight": shared}


TIED = (
    r"'embed\.weight', 'head\.weight' are one tensor \(tied\), but include/exclude select only "
    r"\['{}'\]; expected globs that select all of its names or none"
)


@pytest.mark.parametrize(
    ("options", "flags", "picked"),
    [
        ({"include": ["head.weight"]}, ["--include", "head.weight"], "head.weight"),
        ({"exclude": ["head*"]}, ["--exclude", "head*"], "embed.weight"),
        (
            {"include": ["embed.*", "mid.*"], "keep_masks": True},
            ["--include", "embed.*", "--include", "mid.*", "--keep-masks"],
            "embed.weight",
        ),
    ],
)
def test_a_tied_tensor_selected_by_some_of_its_names_is_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    options: dict[str, object],
    flags: list[str],
    picked: str,
) -> None:
    """Pruned under one name and kept under the other, the names held two tensors, and a
    model loading the file took whichever it read last: refused, as prune_model refuses."""
    state = _tied()
    kept = {k: v.clone() for k, v in state.items()}
    message = TIED.format(picked.replace(".", r"\."))
    with pytest.raises(ValueError, match="^prune_state_dict: " + message):
        prune_state_dict(state, 0.5, **options)  # type: ignore[arg-type]
    assert all(torch.equal(state[k], kept[k]) for k in kept)
    source = tmp_path / "in.pt"
    torch.save(state, source)  # keeps the names on one storage
    out = tmp_path / "out.pt"
    out.write_bytes(b"an earlier output")
    with pytest.raises(ValueError, match="^prune_file: " + message):
        prune_file(source, out, 0.5, **options)  # type: ignore[arg-type]
    assert out.read_bytes() == b"an earlier output"
    assert main(["prune", str(source), "-o", str(out), "--amount", "0.5", *flags]) == 1
    _, err = capsys.readouterr()
    assert err.startswith("prunekit prune: error: prune_file: 'embed.weight', 'head.weight'")
    assert out.read_bytes() == b"an earlier output"


def test_a_tied_tensor_selected_by_all_or_none_of_its_names_prunes() -> None:
    state = _tied()
    both = prune_state_dict(state, 0.5, include=["embed.weight", "head.weight"]).state
    assert torch.equal(both["embed.weight"], both["head.weight"])
    assert int((both["embed.weight"] == 0).sum()) == 16
    none = prune_state_dict(state, 0.5, include=["mid.weight"]).state
    assert none["embed.weight"] is state["embed.weight"] is none["head.weight"]
    # The same values in two tensors are no tie: each name is pruned on its own.
    apart = {**state, "head.weight": state["embed.weight"].clone()}
    alone = prune_state_dict(apart, 0.5, include=["head.weight"]).state
    assert torch.equal(alone["embed.weight"], state["embed.weight"])
    assert int((alone["head.weight"] == 0).sum()) == 16
