"""One vocabulary across the whole-model entry points: scope=, include=, exclude=; the old
spellings (global_pruning=, --global, ignore=) still work, each with a FutureWarning naming
the new one, and give the same result."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import prunekit
from prunekit.io.sharded import INDEX, prune_sharded
from prunekit.io.statedict import prune_file, prune_state_dict
from prunekit.tools.cli import main

st = pytest.importorskip("safetensors.torch")


def state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "a.weight": torch.randn(8, 6),
        "b.weight": torch.randn(5, 4) * 3,
        "b.bias": torch.randn(5),
    }


def same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_prune_state_dict_global_pruning_warns_and_means_scope_global() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling warns of nothing
        want = prune_state_dict(state(), 0.5, method="l1", scope="global").state
        layer = prune_state_dict(state(), 0.5, method="l1", scope="layer").state
    assert not same(want, layer)  # the two scopes differ on this state
    with pytest.warns(FutureWarning, match=r"global_pruning= is renamed scope=.*scope='global'"):
        got = prune_state_dict(state(), 0.5, method="l1", global_pruning=True).state
    assert same(got, want)
    with pytest.warns(FutureWarning, match=r"scope='layer'"):
        got = prune_state_dict(state(), 0.5, method="l1", global_pruning=False).state
    assert same(got, layer)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"scope": "global", "global_pruning": False}, ValueError, "disagree"),
        ({"global_pruning": "yes"}, TypeError, r"global_pruning='yes'; expected a bool"),
        ({"scope": "model"}, ValueError, r"prune_state_dict: invalid scope='model'"),
        ({"method": "ln", "scope": "global"}, ValueError, "use method 'l1' or 'random'"),
    ],
)
def test_prune_state_dict_bad_scope(kwargs: dict[str, object], error: type, match: str) -> None:
    options = {"method": "l1", **kwargs}
    method = options.pop("method")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(error, match=match):
            prune_state_dict(state(), 0.5, method=method, **options)  # type: ignore[arg-type]


def test_prune_file_global_pruning(tmp_path: Path) -> None:
    source = tmp_path / "in.pt"
    torch.save(state(), source)
    prune_file(source, tmp_path / "new.pt", 0.5, method="l1", scope="global")
    with pytest.warns(FutureWarning, match="prune_file: global_pruning= is renamed scope="):
        prune_file(source, tmp_path / "old.pt", 0.5, method="l1", global_pruning=True)
    new, old = torch.load(tmp_path / "new.pt"), torch.load(tmp_path / "old.pt")
    assert same(old, new)


def write_shards(folder: Path) -> Path:
    folder.mkdir()
    tensors = state()
    weight_map = {}
    for number, name in enumerate(tensors, 1):
        file = f"model-{number:05d}-of-00003.safetensors"
        st.save_file({name: tensors[name]}, str(folder / file), metadata={"format": "pt"})
        weight_map[name] = file
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def test_prune_sharded_global_pruning(tmp_path: Path) -> None:
    folder = write_shards(tmp_path / "in")
    new = prune_sharded(folder, tmp_path / "new", 0.5, method="l1", scope="global")
    with pytest.warns(FutureWarning, match="prune_sharded: global_pruning= is renamed scope="):
        old = prune_sharded(folder, tmp_path / "old", 0.5, method="l1", global_pruning=True)
    assert (old.numel, old.zeros, old.pruned) == (new.numel, new.zeros, new.pruned)
    for file in sorted(p.name for p in (tmp_path / "new").glob("*.safetensors")):
        a = st.load_file(str(tmp_path / "new" / file))
        b = st.load_file(str(tmp_path / "old" / file))
        assert same(b, a)
    layer = prune_sharded(folder, tmp_path / "layer", 0.5, method="l1")
    assert layer.zeros != new.zeros or any(
        not same(st.load_file(str(tmp_path / "layer" / f.name)), st.load_file(str(f)))
        for f in (tmp_path / "new").glob("*.safetensors")
    )


def test_cli_global_is_scope_global(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.pt"
    torch.save(state(), source)
    assert main(["prune", str(source), "-o", str(tmp_path / "new.pt"), "--amount", "0.5",
                 "--scope", "global"]) == 0  # fmt: skip
    said = capsys.readouterr().out
    assert "globally" in said
    with pytest.warns(FutureWarning, match="--global is renamed --scope global"):
        status = main(["prune", str(source), "-o", str(tmp_path / "old.pt"), "--amount", "0.5",
                       "--global"])  # fmt: skip
    assert status == 0
    assert "globally" in capsys.readouterr().out
    assert same(torch.load(tmp_path / "old.pt"), torch.load(tmp_path / "new.pt"))


def test_cli_global_and_scope_layer_disagree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.pt"
    torch.save(state(), source)
    out = tmp_path / "out.pt"
    argv = ["prune", str(source), "-o", str(out), "--amount", "0.5", "--global", "--scope",
            "layer"]  # fmt: skip
    assert main(argv) == 1
    assert "--global is the old spelling of --scope global" in capsys.readouterr().err
    assert not out.exists()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def channel_masks(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if k.endswith("_mask")}


def test_prune_channels_ignore_warns_and_means_exclude() -> None:
    torch.manual_seed(0)
    base = Net()
    x = torch.randn(4, 6)
    new, old = Net(), Net()
    new.load_state_dict(base.state_dict())
    old.load_state_dict(base.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prunekit.prune_channels(new, x, 0.5, exclude="a")  # one str is one glob
    with pytest.warns(FutureWarning, match=r"prune_channels: ignore= is renamed exclude="):
        prunekit.prune_channels(old, x, 0.5, ignore=["a"])
    assert getattr(new.a, "weight_mask", torch.ones(1)).all()  # its output channels stay
    assert not new.b.weight_mask.all()
    got, want = channel_masks(old), channel_masks(new)
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_prune_channels_exclude_errors_name_the_argument_given() -> None:
    model, x = Net(), torch.randn(4, 6)
    with pytest.raises(ValueError, match=r"exclude='nope\*' names no module"):
        prunekit.prune_channels(model, x, 0.5, exclude=["nope*"])
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="got both"):
        prunekit.prune_channels(model, x, 0.5, exclude=["a"], ignore=["b"])
    assert not prunekit.is_pruned(model)
