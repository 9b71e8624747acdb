"""Hostile calls of the checkpoint functions (prunekit.io.checkpoint): a state_dict or file
that cannot load is named before anything changes and the model is left bit for bit as it
was; a model's own state_dict, extra state included, goes through save_pruned and
load_pruned and comes back whole."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from hostile.support import refused


class Noted(nn.Linear):
    """A Linear with extra state (``get_extra_state``): what torch saves beside tensors."""

    def __init__(self, *sizes: int) -> None:
        super().__init__(*sizes)
        self.note = {"calibrated": 1}

    def get_extra_state(self) -> dict[str, int]:
        return dict(self.note)

    def set_extra_state(self, state: Any) -> None:
        self.note = dict(state)


def mlp(seed: int = 0, noted: bool = False) -> nn.Sequential:
    torch.manual_seed(seed)
    first = Noted(6, 8) if noted else nn.Linear(6, 8)
    return nn.Sequential(first, nn.ReLU(), nn.Linear(8, 3))


def pruned(noted: bool = False) -> nn.Sequential:
    """Other values than mlp()'s, with its first weight pruned."""
    model = mlp(seed=1, noted=noted)
    prunekit.l1_unstructured(model[0], "weight", 0.5)
    return model


SAVED = pruned().state_dict()

BAD_ENTRIES: list[tuple[str, dict[Any, Any], type[BaseException], str]] = [
    ("list", {**SAVED, "2.bias": [1.0, 2.0, 3.0]}, TypeError, r"'2\.bias'.*list"),
    ("number-orig", {**SAVED, "0.weight_orig": 1}, TypeError, r"'0\.weight_orig'.*int"),
    ("int-key", {**SAVED, 5: torch.ones(1)}, TypeError, r"key 5.*int"),
    ("meta", {**SAVED, "2.weight": torch.empty(3, 8, device="meta")}, ValueError,
     r"'2\.weight'.*meta"),
    ("meta-orig", {**SAVED, "0.weight_orig": torch.empty(8, 6, device="meta")}, ValueError,
     r"'0\.weight_orig'.*meta"),
    ("sparse", {**SAVED, "2.weight": SAVED["2.weight"].to_sparse()}, ValueError,
     r"'2\.weight'.*sparse"),
    ("quantized", {**SAVED, "2.weight": torch.quantize_per_tensor(SAVED["2.weight"], 0.1, 0,
     torch.qint8)}, ValueError, r"'2\.weight'.*quantized"),
    ("nested", {**SAVED, "2.bias": torch.nested.as_nested_tensor([torch.ones(3)])}, ValueError,
     r"'2\.bias'.*nested"),
]  # fmt: skip


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("into", ["plain", "pruned"])
@pytest.mark.parametrize(
    ("state", "error", "match"), [c[1:] for c in BAD_ENTRIES], ids=[c[0] for c in BAD_ENTRIES]
)
def test_a_bad_entry_is_named_and_nothing_loads(
    state: dict[Any, Any], error: type[BaseException], match: str, into: str, strict: bool
) -> None:
    model = mlp(seed=2) if into == "plain" else copy.deepcopy(pruned())
    with torch.no_grad():
        for p in model.parameters():  # values of its own: a partial load shows
            p.add_(1)
    refused(
        lambda: prunekit.load_pruned_state_dict(model, state, strict=strict),
        error,
        f"load_pruned_state_dict.*{match}",
        model=model,
    )


def test_a_model_with_extra_state_loads_its_own_state_dict() -> None:
    source = pruned(noted=True)
    source[0].note = {"calibrated": 2}
    fresh = mlp(noted=True)
    prunekit.load_pruned_state_dict(fresh, source.state_dict())
    assert fresh[0].note == {"calibrated": 2}
    assert prunekit.is_pruned(fresh)
    x = torch.randn(4, 6)
    assert torch.equal(fresh(x), source(x))


def test_save_pruned_and_load_pruned_keep_extra_state(tmp_path: Path) -> None:
    source = pruned(noted=True)
    source[0].note = {"calibrated": 2}
    path = prunekit.save_pruned(source, tmp_path / "pruned.pt")
    fresh = mlp(noted=True)
    prunekit.load_pruned(fresh, path)
    assert fresh[0].note == {"calibrated": 2}
    x = torch.randn(4, 6)
    assert torch.equal(fresh(x), source(x))


def test_extra_state_is_refused_by_safetensors_before_a_file_changes(tmp_path: Path) -> None:
    source = pruned(noted=True)
    path = tmp_path / "pruned.safetensors"
    path.write_bytes(b"the old file")
    refused(
        lambda: prunekit.save_pruned(source, path),
        ValueError,
        r"pruned\.safetensors.*'0\._extra_state'.*dict.*tensors only",
        paths=(path,),
    )


def test_save_compacted_refuses_extra_state_by_module_before_writing(tmp_path: Path) -> None:
    source = pruned(noted=True)
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "keep.txt").write_text("the old save")
    refused(
        lambda: prunekit.save_compacted(source, folder),
        ValueError,
        r"^save_compacted: .*module '0' \(Noted\).*extra state.*dict",
        paths=(folder,),
    )


def on_meta() -> nn.Sequential:
    """A pruned model whose last layer is on the meta device (a shape without values)."""
    model = pruned()
    model[2].to("meta")
    return model


@pytest.mark.parametrize("name", ["pruned.pt", "pruned.safetensors"])
@pytest.mark.parametrize("permanent", [False, True])
def test_save_pruned_refuses_a_model_on_the_meta_device(
    tmp_path: Path, name: str, permanent: bool
) -> None:
    """A .pt file held the meta tensors (load_pruned then refused it); safetensors raised a
    raw 'Cannot copy out of meta tensor'."""
    path = tmp_path / name
    path.write_bytes(b"the old file")
    refused(
        lambda: prunekit.save_pruned(on_meta(), path, permanent=permanent),
        ValueError,
        r"^save_pruned: .*'2\.weight' is on the meta device",
        paths=(path,),
    )


def test_save_compacted_refuses_a_model_on_the_meta_device(tmp_path: Path) -> None:
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "keep.txt").write_text("the old save")
    refused(
        lambda: prunekit.save_compacted(on_meta(), folder),
        ValueError,
        r"^save_compacted: .*'2\.weight' is on the meta device",
        paths=(folder,),
    )
