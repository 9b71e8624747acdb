"""A failed call changes nothing: models (in-place buffer writes, configs, pruner state), files
and folders; NaN counts as a difference; reads never block."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from prunekit.core.transaction import transaction
from prunekit.io.files import CheckpointError
from prunekit.io.sharded import INDEX, prune_sharded
from prunekit.tools.cli import main

st = pytest.importorskip("safetensors.torch")


class Counted(nn.Module):
    """A small MLP whose forward counts its calls in a buffer, in place."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.b(torch.relu(self.a(x)))


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict(keep_vars=False).items()}


def assert_same(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert list(after) == list(before)
    for key, value in before.items():
        got = after[key]
        assert got.dtype == value.dtype and got.shape == value.shape, key
        assert torch.equal(got.view(-1).view(torch.uint8), value.view(-1).view(torch.uint8)), key


X = torch.randn(5, 6)


# -- point 13: in-place buffer writes are undone ------------------------------------------


def test_failed_prune_channels_undoes_the_forward_s_buffer_write() -> None:
    model = Counted()
    before = state(model)

    def loss(output: Any, batch: Any) -> torch.Tensor:
        raise KeyError("the user's loss")

    with pytest.raises((KeyError, ValueError), match="the user's loss"):
        prunekit.prune_channels(model, X, 0.5, criterion="taylor", calibration=[X], loss=loss)
    assert_same(model, before)


def test_failed_compact_undoes_the_forward_s_buffer_write() -> None:
    model = Counted()
    prunekit.prune_channels(model, X, 0.5)
    before = state(model)
    with pytest.raises(ValueError):
        prunekit.compact(model, X, tolerance=-1.0)  # checked before anything runs
    with pytest.raises(ValueError, match=r"^compact: the model cannot take example_inputs: "):
        prunekit.compact(model, torch.randn(5, 7), latency_runs=0)
    assert_same(model, before)


def test_failed_calibration_undoes_the_forward_s_buffer_write() -> None:
    model = Counted()
    before = state(model)
    bad = [X, torch.randn(5, 7)]  # the second batch does not fit the model
    with pytest.raises(Exception):  # noqa: B017 (the user's model raises its own error)
        prunekit.prune_model(model, 0.5, method="wanda", calibration=bad, include="a.weight")
    assert_same(model, before)


def test_a_parameter_written_in_place_is_restored_when_declared() -> None:
    model = Counted()
    before = state(model)
    with pytest.raises(RuntimeError), transaction(model, writes=[model.a.weight]):
        with torch.no_grad():
            model.a.weight.mul_(2)
            model.b.weight.data = torch.zeros(4, 8)
        raise RuntimeError("fail")
    assert_same(model, before)


def test_an_undeclared_parameter_written_in_place_is_named_in_a_note() -> None:
    model = Counted()
    with pytest.raises(RuntimeError) as caught, transaction(model):
        with torch.no_grad():
            model.a.weight.add_(1)
        raise RuntimeError("fail")
    assert "Linear.weight" in "".join(getattr(caught.value, "__notes__", []))


def test_an_untouched_buffer_is_not_cloned_but_watched_and_put_back() -> None:
    model = nn.Linear(4, 4)
    model.register_buffer("big", torch.ones(4, 4))
    big = model.big
    with pytest.raises(RuntimeError), transaction(model, untouched=[big]) as recorded:
        assert recorded._tensors[id(big)].copy is None  # no copy of its values
        model._buffers["big"] = torch.zeros(4, 4)  # replaced: the old one comes back
        raise RuntimeError("fail")
    assert model.big is big and torch.equal(big, torch.ones(4, 4))
    with pytest.raises(RuntimeError) as caught, transaction(model, untouched=[big]):
        big.add_(1)  # written in place after all: named, not silently kept
        raise RuntimeError("fail")
    assert "Linear.big" in "".join(getattr(caught.value, "__notes__", []))
    with transaction(model, writes=[big], untouched=[big]) as recorded:  # declared: cloned
        assert recorded._tensors[id(big)].copy is not None


def test_pruning_again_does_not_clone_the_mask_it_replaces(monkeypatch: Any) -> None:
    from prunekit.core import transaction as module
    from prunekit.dropin import install

    model = nn.Linear(8, 8)
    prunekit.l1_unstructured(model, "weight", amount=0.25)
    old = model.weight_mask
    cloned: list[int] = []
    made = module._Tensor.__init__

    def spy(self: Any, tensor: torch.Tensor, name: str, copy: bool) -> None:
        if copy:
            cloned.append(id(tensor))
        made(self, tensor, name, copy)

    monkeypatch.setattr(module._Tensor, "__init__", spy)
    assert install.transaction is module.transaction
    prunekit.l1_unstructured(model, "weight", amount=0.25)
    assert id(old) not in cloned and model.weight_mask is not old
    assert int((model.weight == 0).sum()) == 16 + 12  # the old mask kept, composed


# -- point 2: NaN is a difference -----------------------------------------------------------


class NaNOnNarrow(nn.Module):
    """Gives NaN on its output once compacted (a width it did not expect)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(torch.relu(self.a(x)))
        if self.a.out_features != 8:
            y = y + float("nan")
        return y


def test_compact_refuses_an_output_that_became_nan() -> None:
    model = NaNOnNarrow()
    prunekit.prune_channels(model, X, 0.5)
    before = state(model)
    with pytest.raises(RuntimeError, match="nan"):
        prunekit.compact(model, X, latency_runs=0)
    assert_same(model, before)
    assert model.a.out_features == 8


class MaskedLogits(nn.Module):
    """Logits with a class ruled out (-inf), as constrained decoding masks them; once
    compacted, `shift` is added to the others where `wrong` is set (a compaction gone wrong
    beside an infinity that stays equal), or the ruled-out class turns +inf (`flip`)."""

    def __init__(self, wrong: float = 0.0, flip: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 4)
        self.wrong, self.flip = wrong, flip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b(torch.relu(self.a(x)))
        narrow = self.a.out_features != 8
        y = y + (self.wrong if narrow else 0.0)
        ruled_out = torch.tensor([False, False, True, False])
        return y.masked_fill(ruled_out, float("inf") if narrow and self.flip else float("-inf"))


def test_compact_takes_outputs_of_equal_infinities() -> None:
    """-inf in both outputs at one place is no difference (it was NaN: inf - inf)."""
    model = MaskedLogits()
    prunekit.prune_channels(model, X, 0.5)
    expected = model(X)
    prunekit.compact(model, X, latency_runs=0)
    assert model.a.out_features == 4
    torch.testing.assert_close(model(X), expected)


@pytest.mark.parametrize(("wrong", "flip"), [(1.0, False), (0.0, True)])
def test_compact_refuses_a_difference_beside_an_infinity(wrong: float, flip: bool) -> None:
    """An infinite output sets no infinite scale: a finite difference beside it is still
    one, as is an infinity of the other sign."""
    model = MaskedLogits(wrong, flip)
    prunekit.prune_channels(model, X, 0.5)
    before = state(model)
    with pytest.raises(RuntimeError, match=r"differs from the masked one by (1|inf)"):
        prunekit.compact(model, X, latency_runs=0)
    assert_same(model, before)
    assert model.a.out_features == 8


# -- point 7: the Hugging Face config is restored -------------------------------------------


def test_a_failed_compact_restores_the_hugging_face_config() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=4,
                                     n_positions=8, n_inner=32)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = {"input_ids": torch.arange(8).reshape(1, 8)}
    prunekit.prune_channels(model, ids, 0.5, heads=0.5, hidden=0.25)
    fields = model.config.to_dict()
    before = state(model)
    original = model.forward

    def broken(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if model.transformer.h[0].mlp.c_fc.weight.shape[1] != 32:
            out.logits = out.logits + 1.0  # the compacted model computes something else
        return out

    model.forward = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="differs"):
        prunekit.compact(model, ids, latency_runs=0)
    assert model.config.to_dict() == fields
    assert_same(model, before)


# -- point 6 and 11: the pruner's own state -------------------------------------------------


def test_a_gradual_step_that_raises_is_not_counted() -> None:
    model = Counted()
    armed = {"on": False}

    def schedule(step: int) -> float:
        if armed["on"]:
            raise ArithmeticError("the user's schedule")
        return 0.25 * step

    pruner = prunekit.GradualPruner(model, 0.75, start_step=1, end_step=3, schedule=schedule)
    pruner.step()
    armed["on"] = True
    before, generator = state(model), pruner._generator.get_state()
    with pytest.raises(ArithmeticError):
        pruner.step()
    assert (pruner.steps, pruner.amount) == (1, 0.25)
    assert torch.equal(pruner._generator.get_state(), generator)
    assert_same(model, before)
    armed["on"] = False
    pruner.step()  # retried: now it prunes
    assert (pruner.steps, pruner.amount) == (2, 0.5)


def test_a_gradual_step_on_a_nan_weight_is_not_counted() -> None:
    model = Counted()
    pruner = prunekit.GradualPruner(model, 0.5, start_step=1, end_step=3)
    pruner.step()
    with torch.no_grad():
        model.a.weight_orig[0, 0] = float("nan")
    before = state(model)
    with pytest.raises(ValueError, match="nan"):
        pruner.step()
    assert pruner.steps == 1 and pruner.amount == 0.0
    assert_same(model, before)


def test_gradual_load_state_dict_checks_everything_before_installing() -> None:
    model = Counted()
    pruner = prunekit.GradualPruner(model, 0.5, start_step=1, end_step=3, seed=0)
    pruner.step()
    saved = pruner.state_dict()
    fresh = Counted()
    other = prunekit.GradualPruner(fresh, 0.5, start_step=1, end_step=3, seed=0)
    before = state(fresh)
    bad = dict(saved)
    bad["generator"] = torch.zeros(3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="generator"):
        other.load_state_dict(bad)
    assert_same(fresh, before)
    assert other.steps == 0 and not prunekit.is_pruned(fresh)


@pytest.mark.parametrize("change", ["missing", "extra", "shape"])
def test_rewind_refuses_a_bad_state_before_any_change(change: str) -> None:
    model = Counted()
    pruner = prunekit.GradualPruner(model, 0.5, start_step=1, end_step=3)
    early = {k: v.clone() for k, v in model.state_dict().items()}
    pruner.step()
    with torch.no_grad():  # training moved the weights since
        for p in model.parameters():
            p.add_(1.0)
    before = state(model)
    if change == "missing":
        del early["b.bias"]
    elif change == "extra":
        early["c.weight"] = torch.zeros(2)
    else:
        early["b.bias"] = torch.zeros(5)
    with pytest.raises((ValueError, KeyError, RuntimeError)):
        pruner.rewind(early)
    assert_same(model, before)


# -- point 12: the manifest of save_compacted is validated ------------------------------------


@pytest.mark.parametrize(
    ("attribute", "value"),
    [("forward", 3), ("in_features", "abc"), ("training", 0), ("in_features", True),
     ("__class__", 1), ("in_features", [1, 2])],
)  # fmt: skip
def test_load_compacted_refuses_attributes_it_never_writes(
    tmp_path: Path, attribute: str, value: Any
) -> None:
    model = Counted()
    prunekit.save_compacted(model, tmp_path)
    manifest = json.loads((tmp_path / "compacted.json").read_text())
    module = manifest["modules"]["a"]
    module.setdefault("attributes", {})[attribute] = value
    (tmp_path / "compacted.json").write_text(json.dumps(manifest))
    fresh = Counted()
    before = state(fresh)
    with pytest.raises(ValueError, match="'a'"):
        prunekit.load_compacted(fresh, tmp_path)
    assert_same(fresh, before)


@pytest.mark.parametrize(
    "modules", [{"a": 3}, {"a": {"class": 3}}, {"a": {"tensors": "x"}}, {"a": {"attributes": []}}]
)
def test_load_compacted_a_malformed_manifest_is_a_clear_error(tmp_path: Path, modules: Any) -> None:
    model = Counted()
    prunekit.save_compacted(model, tmp_path)
    manifest = json.loads((tmp_path / "compacted.json").read_text())
    manifest["modules"].update(modules)
    (tmp_path / "compacted.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"compacted\.json"):
        prunekit.load_compacted(Counted(), tmp_path)


# -- point 3: save_compacted replaces the folder's save as a whole ----------------------------


def test_a_failed_save_compacted_leaves_the_old_save_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = Counted()
    prunekit.save_compacted(old, tmp_path / "s")
    files = {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir()}
    import prunekit.structure.saving.saving as saving

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # as if killed between the weights and the manifest

    monkeypatch.setattr(saving.json, "dump", killed)
    with pytest.raises(KeyboardInterrupt):
        prunekit.save_compacted(Counted(), tmp_path / "s")
    assert {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir()} == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
    loaded = prunekit.load_compacted(Counted(), tmp_path / "s")
    assert torch.equal(loaded.a.weight, old.a.weight)


# -- points 1, 4, 10: sharded folders -------------------------------------------------------


def write_sharded(folder: Path) -> Path:
    folder.mkdir()
    torch.manual_seed(0)
    parts = {"model-1.safetensors": {"a.weight": torch.randn(8, 6), "a.bias": torch.randn(8)},
             "model-2.safetensors": {"b.weight": torch.randn(4, 8)}}  # fmt: skip
    weight_map = {}
    for file, tensors in parts.items():
        st.save_file(tensors, str(folder / file))
        weight_map.update(dict.fromkeys(tensors, file))
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("where", ["same", "link", "inside", "parent"])
def test_prune_sharded_refuses_an_output_that_overlaps_its_input(
    tmp_path: Path, where: str
) -> None:
    source = write_sharded(tmp_path / "ckpt")
    before = files_of(tmp_path)
    if where == "link":
        (tmp_path / "alias").symlink_to(source)
        before = files_of(tmp_path)
    out = {"same": source, "link": tmp_path / "alias", "inside": source / "sub",
           "parent": tmp_path}[where]  # fmt: skip
    with pytest.raises(CheckpointError, match="input"):
        prune_sharded(source, out, 0.5, method="l1")
    assert main(["prune", str(source), "-o", str(out), "--amount", "0.5"]) != 0
    assert files_of(tmp_path) == before


def test_a_sharded_output_is_swapped_in_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_sharded(tmp_path / "ckpt")
    out = tmp_path / "out"
    prune_sharded(source, out, 0.5, method="l1")
    (out / "config.json").write_text("{}")  # the user's file beside the shards
    before = files_of(out)
    import prunekit.io.sharded as sharded

    def killed(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(sharded, "_write_index", killed)
    with pytest.raises(KeyboardInterrupt):
        prune_sharded(source, out, 0.75, method="l1")
    assert files_of(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "out"]
    monkeypatch.undo()
    prune_sharded(source, out, 0.75, method="l1")
    assert (out / "config.json").read_text() == "{}"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_fifo_shard_is_refused_without_blocking(tmp_path: Path) -> None:
    source = write_sharded(tmp_path / "ckpt")
    (source / "model-2.safetensors").unlink()
    os.mkfifo(source / "model-2.safetensors")
    with pytest.raises(CheckpointError, match="regular file"):
        prune_sharded(source, tmp_path / "out", 0.5, method="l1")
    assert main(["prune", str(source), "-o", str(tmp_path / "o2"), "--amount", "0.5"]) != 0
    assert not (tmp_path / "out").exists() and not (tmp_path / "o2").exists()


# -- errors attributed to whom raised them --------------------------------------------------


def test_a_loss_that_raises_is_named_as_the_loss() -> None:
    model = Counted()

    def loss(output: Any, batch: Any) -> torch.Tensor:
        raise KeyError("no labels")

    with pytest.raises(ValueError, match=r"the loss raised on batch 0: KeyError: 'no labels'"):
        prunekit.prune_model(model, 0.5, method="taylor", calibration=[X], loss=loss)


def test_prunekit_s_own_hook_error_is_not_blamed_on_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import prunekit.calibrate as calibration

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ZeroDivisionError("a bug in a statistics hook")

    monkeypatch.setattr(calibration.InputStatistics, "_features", broken)
    model = Counted()
    before = state(model)
    with pytest.raises(ZeroDivisionError, match="a bug"):
        prunekit.prune_model(model, 0.5, method="wanda", calibration=[X], sequential=False)
    assert_same(model, before)


def test_the_user_s_model_error_is_named_as_the_batch_s() -> None:
    with pytest.raises(ValueError, match="the model cannot take batch 1"):
        prunekit.prune_model(Counted(), 0.5, method="wanda", calibration=[X, torch.ones(2, 3)])


class Unused(Counted):
    def __init__(self) -> None:
        super().__init__()
        self.spare = nn.Linear(4, 4)  # never called by forward


def test_calibrated_errors_name_the_module_path() -> None:
    model = Unused()
    with pytest.raises(
        ValueError, match=r"'spare\.weight', parameter 'weight' of Linear never ran"
    ):
        prunekit.prune_model(model, 0.5, method="wanda", calibration=[X], include="*.weight")
    with pytest.raises(ValueError, match=r"'a\.weight', parameter 'weight' of Linear"):
        prunekit.prune_model(model, 0.5, method="sparsegpt", calibration=[X], pattern="2:4",
                             include="a.weight")  # fmt: skip


def test_complex_masks_meta_and_sparse_weights_and_a_bad_progress_are_refused() -> None:
    layer = nn.Linear(4, 4)
    with pytest.raises(TypeError, match="complex"):
        prunekit.custom_from_mask(layer, "weight", torch.ones(4, 4, dtype=torch.complex64))
    assert not prunekit.is_pruned(layer)
    meta = nn.Linear(4, 4, device="meta")
    with pytest.raises(ValueError, match="meta"):
        prunekit.random_unstructured(meta, "weight", 0.5)
    sparse = nn.Linear(4, 4)
    sparse.weight = nn.Parameter(torch.ones(4, 4).to_sparse())
    with pytest.raises(ValueError, match="sparse"):
        prunekit.random_unstructured(sparse, "weight", 0.5)
    assert not prunekit.is_pruned(meta) and not prunekit.is_pruned(sparse)
    model = Counted()
    before = state(model)
    with pytest.raises(TypeError, match="progress='x'"):
        prunekit.prune_model(model, 0.5, method="wanda", calibration=[X], progress="x")
    assert_same(model, before)
