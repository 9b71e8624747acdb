"""save_compacted / load_compacted: compacted models with per-layer widths rebuilt in freshly
built ones, bit for bit; errors that name what differs and leave the fresh model unchanged."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from helpers.model_state import fingerprint
from prunekit.structure.saving import saving, skeleton


class Net(nn.Module):
    """BatchNorm, a grouped conv, a flatten into a Linear, a LayerNorm and a bias-less Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.fc1 = nn.Linear(8 * 16, 32)
        self.fc2 = nn.Linear(32, 24)
        self.ln = nn.LayerNorm(24)
        self.head = nn.Linear(24, 5, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.relu(self.grouped(x))
        x = torch.sigmoid(self.fc1(x.flatten(1)))
        return self.head(self.ln(torch.relu(self.fc2(x))))


def widths(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Every module's int and tuple attributes (what fixes its widths)."""
    return {
        path: {
            k: v
            for k, v in vars(m).items()
            if isinstance(v, int | tuple) and not isinstance(v, bool)
        }
        for path, m in model.named_modules()
    }


def compacted(model: nn.Module, x: Any, amount: float = 0.4) -> nn.Module:
    prunekit.prune_channels(model, x, amount, scope="global")
    prunekit.compact(model, x, latency_runs=0)
    return model.eval()


def assert_same(model: nn.Module, fresh: nn.Module, x: Any) -> None:
    """Bit-identical tensors, the same attributes and the same outputs."""
    a, b = model.state_dict(), fresh.state_dict()
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
    assert widths(model) == widths(fresh)
    with torch.no_grad():
        assert torch.equal(model(x), fresh.eval()(x))


def test_a_cnn_with_per_layer_widths_round_trips(tmp_path: Path) -> None:
    x = torch.randn(4, 3, 4, 4)
    model = compacted(Net(), x)
    assert model.conv.out_channels < 8 and model.fc1.out_features < 32  # widths differ per layer
    folder = prunekit.save_compacted(model, tmp_path / "saved")
    assert sorted(p.name for p in folder.iterdir()) == ["compacted.json", "compacted.safetensors"]
    fresh = Net()
    assert prunekit.load_compacted(fresh, folder) is fresh
    assert_same(model, fresh, x)
    assert fresh.bn.num_features == model.conv.out_channels
    assert fresh.grouped.in_channels == model.conv.out_channels and fresh.grouped.groups == 2
    manifest = json.loads((folder / "compacted.json").read_text())
    assert manifest["modules"]["fc1"]["attributes"]["in_features"] == model.fc1.in_features
    assert manifest["modules"]["ln"]["attributes"]["normalized_shape"] == {"tuple": [24]}
    assert manifest["config"] is None


def test_a_bias_made_by_compact_and_a_tensor_still_masked(tmp_path: Path) -> None:
    """compact folds the constant of a removed channel into a bias the fresh model lacks;
    a tensor pruned after compaction comes back with its mask."""
    model, x = Net().eval(), torch.randn(4, 3, 4, 4)
    rows = torch.ones(32, 128)
    rows[::3] = 0  # fc1 rows masked, not its bias: sigmoid(bias) reaches fc2 as a constant
    prunekit.custom_from_mask(model.fc1, "weight", rows)
    bias_mask = torch.ones(24)
    bias_mask[::4] = 0
    prunekit.custom_from_mask(model.fc2, "bias", bias_mask)
    prunekit.compact(model, x, latency_runs=0)
    assert model.fc1.out_features == 21 and model.fc2.bias is not None
    prunekit.l1_unstructured(model.head, "weight", 0.5)
    prunekit.save_compacted(model, tmp_path)
    fresh = Net()
    prunekit.load_compacted(fresh, tmp_path)
    assert_same(model, fresh, x)
    assert prunekit.is_pruned(fresh) and torch.equal(fresh.head.weight_mask, model.head.weight_mask)
    assert torch.equal(fresh.fc2.bias_mask, model.fc2.bias_mask)


def test_a_linear_mlp_without_safetensors_uses_torch_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(6, 20), nn.GELU(), nn.Linear(20, 16), nn.Tanh(),
                             nn.Linear(16, 3))  # fmt: skip

    x = torch.randn(8, 6)
    model = compacted(mlp(), x, 0.5)
    monkeypatch.setattr(saving, "_has_safetensors", lambda: False)
    prunekit.save_compacted(model, tmp_path)
    assert (tmp_path / "compacted.pt").is_file()
    fresh = mlp()
    prunekit.load_compacted(fresh, tmp_path)
    assert_same(model, fresh, x)
    assert (
        [m.out_features for m in fresh if isinstance(m, nn.Linear)][:2]
        == [m.out_features for m in model if isinstance(m, nn.Linear)][:2]
        != [20, 16]
    )


def test_tied_parameters_stay_tied(tmp_path: Path) -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 8)
            self.up = nn.Linear(8, 12)
            self.down = nn.Linear(12, 8)
            self.out = nn.Linear(8, 10, bias=False)
            self.out.weight = self.embed.weight

        def forward(self, ids: Tensor) -> Tensor:
            h = self.embed(ids)
            return self.out(h + self.down(torch.relu(self.up(h))))

    x = torch.randint(0, 10, (2, 5))
    model = compacted(Tied(), x, 0.5)
    assert model.up.out_features < 12 and model.embed.embedding_dim < 8  # the tie shrank too
    prunekit.save_compacted(model, tmp_path)
    fresh = Tied()
    prunekit.load_compacted(fresh, tmp_path)
    assert_same(model, fresh, x)
    assert fresh.out.weight is fresh.embed.weight


class Scaled(nn.Module):
    """Embedding scales fixed when built: a float attribute, a non-persistent buffer."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, width)
        self.embed.embed_scale = width**0.5
        self.register_buffer("embed_scale", torch.tensor(2.0), persistent=False)
        self.out = nn.Linear(width, 10)

    def forward(self, ids: Tensor) -> Tensor:
        return self.out(self.embed(ids) * self.embed.embed_scale * self.embed_scale)


def test_embedding_scales_are_saved_restored_and_checked(tmp_path: Path) -> None:
    """The scales a model computes with, not the ones its code builds, reload both ways; a
    file without them (written before they were saved) loads as before; a scale that is no
    finite float, or one the fresh module lacks, is refused naming it."""
    x = torch.randint(0, 10, (2, 5))
    model = Scaled().eval()
    model.embed.embed_scale = 3.0
    model.embed_scale = torch.tensor(5.0)
    prunekit.save_compacted(model, tmp_path)
    where = tmp_path / "compacted.json"
    manifest = json.loads(where.read_text())
    assert manifest["modules"]["embed"]["scales"] == {"embed_scale": 3.0}
    assert manifest["modules"][""]["scales"] == {"embed_scale": 5.0}
    assert "scales" not in manifest["modules"]["out"]
    fresh = Scaled()
    prunekit.load_compacted(fresh, tmp_path)
    alone = prunekit.load_compacted(tmp_path, factory=lambda config: Scaled())
    for loaded in (fresh, alone):
        assert loaded.embed.embed_scale == 3.0 and float(loaded.embed_scale) == 5.0
        with torch.no_grad():
            assert torch.equal(loaded.eval()(x), model(x))
    lacking = Scaled()
    del lacking.embed.embed_scale
    _refused(lacking, tmp_path, ValueError, r"module 'embed' \(Embedding\) was saved with "
             r"the embedding scale embed_scale=3.0, which the model's module does not "
             r"hold")  # fmt: skip
    for bad in (float("nan"), float("inf"), "3.0", 3, True, None):
        manifest["modules"]["embed"]["scales"] = {"embed_scale": bad}
        where.write_text(json.dumps(manifest))
        _refused(Scaled(), tmp_path, ValueError, rf"{re.escape(str(where))}: module 'embed' has "
                 rf"the embedding scale 'embed_scale': {re.escape(repr(bad))}; expected a finite "
                 r"float")  # fmt: skip
    manifest["modules"]["embed"]["scales"] = {"scale": 3.0}
    where.write_text(json.dumps(manifest))
    _refused(Scaled(), tmp_path, ValueError, r"module 'embed' has the embedding scale "
             r"'scale': 3.0; expected a finite float under one of \['scalar_embed_scale', "
             r"'embed_scale'\]")  # fmt: skip
    for entry in manifest["modules"].values():
        entry.pop("scales", None)
    where.write_text(json.dumps(manifest))  # as written before scales were saved
    old = prunekit.load_compacted(Scaled(), tmp_path)
    assert old.embed.embed_scale == 8**0.5 and float(old.embed_scale) == 2.0


def _saved(tmp_path: Path) -> tuple[nn.Module, Any]:
    x = torch.randn(4, 3, 4, 4)
    model = compacted(Net(), x)
    prunekit.save_compacted(model, tmp_path)
    return model, x


def _refused(fresh: nn.Module, path: Path, error: type[Exception], match: str) -> None:
    """load_compacted raises and the fresh model is exactly as it was."""
    before, shapes = fingerprint(fresh), widths(fresh)
    with pytest.raises(error, match=match):
        prunekit.load_compacted(fresh, path)
    assert fingerprint(fresh) == before and widths(fresh) == shapes


def test_a_model_of_other_code_is_refused_unchanged(tmp_path: Path) -> None:
    _saved(tmp_path)
    other = nn.Sequential(nn.Linear(3, 4))
    _refused(other, tmp_path, ValueError, r"modules \['conv'.*not in the model.*same code")
    renamed = Net()
    renamed.fc2 = nn.Conv1d(32, 24, 1)  # type: ignore[assignment]
    _refused(renamed, tmp_path, ValueError, r"'fc2' is a torch.nn.modules.conv.Conv1d.*Linear")


def test_files_that_disagree_name_the_module_tensor_and_shapes(tmp_path: Path) -> None:
    model, _ = _saved(tmp_path)
    where = tmp_path / "compacted.json"
    manifest = json.loads(where.read_text())
    manifest["modules"]["fc2"]["tensors"]["weight"]["shape"] = [24, 99]
    where.write_text(json.dumps(manifest))
    found = (model.fc2.out_features, model.fc2.in_features)
    _refused(Net(), tmp_path, ValueError,
             rf"module 'fc2' \(Linear\): tensor 'weight' is \({found[0]}, {found[1]}\) in the "
             r"weights file but \(24, 99\) in the shapes file")  # fmt: skip


def test_a_failure_while_loading_restores_the_fresh_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _saved(tmp_path)

    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("interrupted")

    monkeypatch.setattr(saving, "verify", fail)  # after every tensor and attribute was set
    _refused(Net(), tmp_path, RuntimeError, "interrupted")


def test_a_pruned_fresh_model_and_bad_folders_are_refused(tmp_path: Path) -> None:
    _saved(tmp_path)
    fresh = Net()
    prunekit.l1_unstructured(fresh.fc1, "weight", 0.5)
    _refused(fresh, tmp_path, ValueError, r"'fc1'.*tensor 'weight' is pruned.*unpruned")
    _refused(Net(), tmp_path / "nowhere", FileNotFoundError, r"compacted.json does not exist")
    (tmp_path / "compacted.safetensors").unlink()
    _refused(Net(), tmp_path, FileNotFoundError, r"weights 'compacted.safetensors'.*not in")
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(ValueError, match=r"save_compacted: path=.* is a file"):
        prunekit.save_compacted(Net(), file)


def test_a_non_persistent_buffer_whose_shape_changed_is_refused(tmp_path: Path) -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("scale", torch.ones(4), persistent=False)

        def forward(self, x: Tensor) -> Tensor:
            return self.fc(x) * self.scale

    model = Scaled()
    model.scale = torch.ones(3)
    prunekit.save_compacted(model, tmp_path)
    _refused(Scaled(), tmp_path, ValueError, r"buffer 'scale' is \(4,\) in the model but was "
             r"\(3,\) when saved, and it is not saved")  # fmt: skip


def test_import_prunekit_imports_neither_transformers_nor_safetensors(
    imported_by: dict[str, frozenset[str]],
) -> None:
    assert sorted(imported_by["prunekit"] & {"transformers", "safetensors"}) == []


def test_a_folder_alone_reloads_with_a_factory_in_eval_mode(tmp_path: Path) -> None:
    """load_compacted(folder, factory=...): built with its parameters on the meta device,
    the file's tensors become the parameters; a tensor saved masked keeps its mask."""
    model, x = _saved(tmp_path)
    prunekit.l1_unstructured(model.head, "weight", 0.5)
    prunekit.save_compacted(model, tmp_path)
    built: list[nn.Module] = []

    def factory(config: Any) -> nn.Module:
        assert config is None  # no Hugging Face config saved
        built.append(Net())
        assert built[-1].fc1.weight.is_meta and not built[-1].bn.running_mean.is_meta
        return built[-1].train()

    loaded = prunekit.load_compacted(tmp_path, factory=factory)
    assert loaded is built[0] and not loaded.training
    assert not any(t.is_meta for t in [*loaded.parameters(), *loaded.buffers()])
    assert_same(model, loaded, x)
    assert torch.equal(loaded.head.weight_mask, model.head.weight_mask)


def test_a_registered_factory_builds_the_saved_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x = _saved(tmp_path)
    before = fingerprint(model)
    named = re.escape(f"{Net.__module__}.Net")  # the test module's name, wherever it is
    with pytest.raises(ValueError, match=r"compacted.json holds no Hugging Face config \(the "
                       rf"model is a {named}\).*factory="):  # fmt: skip
        prunekit.load_compacted(tmp_path)
    monkeypatch.setattr(skeleton, "FACTORIES", {})
    prunekit.register_compacted_factory(Net, lambda config: Net())
    assert_same(model, prunekit.load_compacted(tmp_path), x)
    assert fingerprint(model) == before
    with pytest.raises(TypeError, match=r"invalid model_class of type Net; expected an nn"):
        prunekit.register_compacted_factory(Net(), lambda config: Net())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got a model with path=None"):
        prunekit.load_compacted(Net())  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"factory= with a model|got a model with path="):
        prunekit.load_compacted(Net(), tmp_path, factory=lambda config: Net())
    with pytest.raises(TypeError, match=r"the factory returned a int"):
        prunekit.load_compacted(tmp_path, factory=lambda config: 3)  # type: ignore[arg-type,return-value]


def test_a_folder_alone_whose_files_disagree_names_the_folder(tmp_path: Path) -> None:
    _saved(tmp_path)
    where = tmp_path / "compacted.json"
    manifest = json.loads(where.read_text())
    manifest["modules"]["fc2"]["tensors"]["weight"]["shape"] = [24, 99]
    where.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"load_compacted \({tmp_path}\): module 'fc2' \(Linear"
                       r"\): tensor 'weight' .* but \(24, 99\) in the shapes file"):  # fmt: skip
        prunekit.load_compacted(tmp_path, factory=lambda config: Net())


def test_a_width_that_contradicts_the_saved_tensors_is_refused(tmp_path: Path) -> None:
    model, _ = _saved(tmp_path)
    where = tmp_path / "compacted.json"
    manifest = json.loads(where.read_text())
    manifest["modules"]["fc2"]["attributes"]["out_features"] = 5
    where.write_text(json.dumps(manifest))
    message = (
        rf"\({tmp_path}\): module 'fc2' \(Linear\) was saved with out_features=5, but "
        rf"its saved tensors .*'weight': \(24, {model.fc2.in_features}\).* make it 24"
    )
    _refused(Net(), tmp_path, ValueError, message)
    with pytest.raises(ValueError, match=message):
        prunekit.load_compacted(tmp_path, factory=lambda config: Net())


def test_empty_parameters_holds_only_in_its_thread_and_nests() -> None:
    found: dict[str, torch.device] = {}

    def elsewhere() -> None:
        found["other thread"] = nn.Linear(2, 2).weight.device

    with skeleton.empty_parameters():
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        with skeleton.empty_parameters():
            found["nested"] = nn.Linear(3, 3).weight.device
        layer = nn.BatchNorm1d(3)
    found["after"] = nn.Linear(2, 2).weight.device
    assert found == {"other thread": torch.device("cpu"), "nested": torch.device("meta"),
                     "after": torch.device("cpu")}  # fmt: skip
    assert layer.weight.is_meta and not layer.running_mean.is_meta  # buffers are made as usual


def test_a_relative_folder_saves_and_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The weights file is written through an unnamed file linked in by its folder's
    descriptor: a relative path must name it from the working directory, not twice over."""
    monkeypatch.chdir(tmp_path)
    model, x = compacted(Net(), torch.randn(4, 3, 4, 4)), torch.randn(4, 3, 4, 4)
    prunekit.save_compacted(model, "saved")
    prunekit.save_compacted(model, Path("nested") / "saved")
    for folder in ("saved", "nested/saved"):
        assert_same(model, prunekit.load_compacted(folder, factory=lambda config: Net()), x)


def _damaged(tmp_path: Path, change: Any) -> None:
    where = tmp_path / "compacted.json"
    manifest = json.loads(where.read_text())
    change(manifest)
    where.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("change", "words"),
    [(lambda m: m.update(modules=[]), r"'modules' is \[\] of type list; expected a mapping"),
     (lambda m: m.update(modules={"fc2": []}), r"module 'fc2' is not a mapping"),
     (lambda m: m.update(version="1"), r"'version' is '1' of type str; expected the int 1"),
     (lambda m: m.update(version=2), r"has version 2; this prunekit reads version 1"),
     (lambda m: m.pop("version"), r"lacks 'version'; expected the int 1"),
     (lambda m: m.pop("modules"), r"lacks 'modules'; expected a mapping"),
     (lambda m: m.update(weights=["a"]), r"'weights' is \['a'\] of type list; expected"),
     (lambda m: m.update(model=3), r"'model' is 3 of type int; expected a str"),
     (lambda m: m.update(config=[1]), r"'config' is \[1\] of type list; expected a mapping or "
      r"null")],
)  # fmt: skip
def test_a_malformed_manifest_names_the_field(tmp_path: Path, change: Any, words: str) -> None:
    _saved(tmp_path)
    _damaged(tmp_path, change)
    _refused(Net(), tmp_path, ValueError, rf"load_compacted: .*compacted.json.*{words}")


def test_a_failed_folder_load_leaves_the_factorys_model_as_it_was(tmp_path: Path) -> None:
    """load_compacted(folder, factory=lambda c: existing) is one transaction too."""
    _saved(tmp_path)
    _damaged(tmp_path, lambda m: m["modules"]["fc2"]["attributes"].update(in_features=999))
    existing = Net()
    before, shapes = fingerprint(existing), widths(existing)
    with pytest.raises(ValueError, match=r"'fc2' \(Linear\) was saved with in_features=999"):
        prunekit.load_compacted(tmp_path, factory=lambda config: existing)
    assert fingerprint(existing) == before and widths(existing) == shapes


def test_an_empty_path_is_refused_by_name_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Path('') is the current folder, which took compacted.* unasked."""
    monkeypatch.chdir(tmp_path)
    model = nn.Linear(4, 3)
    with pytest.raises(ValueError, match=r"^save_compacted: invalid path=''; expected a path"):
        prunekit.save_compacted(model, "")
    assert list(tmp_path.iterdir()) == []
