"""prunekit.io.files: reading and writing state_dicts, torch and safetensors, safely."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from torch import nn

from prunekit.io.files import CheckpointError, detect_format, load_state_dict, save_state_dict


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(3, 4, generator=g),
        "a.bias": torch.randn(3, generator=g),
        "steps": torch.tensor(7),
    }


@pytest.mark.parametrize("name", ["model.pt", "model.safetensors", "model.bin"])
def test_round_trip(tmp_path: Path, name: str) -> None:
    state = _state()
    path = save_state_dict(state, tmp_path / name)
    loaded = load_state_dict(path)
    assert sorted(loaded) == sorted(state)
    for key, value in state.items():
        assert torch.equal(loaded[key], value) and loaded[key].dtype == value.dtype
    expected = "safetensors" if name.endswith(".safetensors") else "torch"
    assert detect_format(path) == expected


def test_format_is_read_from_the_content_not_the_suffix(tmp_path: Path) -> None:
    save_state_dict(_state(), tmp_path / "x.safetensors")
    renamed = (tmp_path / "x.safetensors").rename(tmp_path / "x.pt")
    assert detect_format(renamed) == "safetensors"
    assert torch.equal(load_state_dict(renamed)["a.bias"], _state()["a.bias"])


def _safetensors_with_header_of(size: int) -> bytes:
    """A valid .safetensors file of one float32 'w' = [1.5], its JSON header padded with
    spaces (as safetensors pads it) to `size` bytes."""
    header = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    return size.to_bytes(8, "little") + header.ljust(size) + struct.pack("<f", 1.5)


@pytest.mark.parametrize("size", [128, 384])  # the first byte is 0x80, as a pickle's
def test_a_safetensors_header_size_is_not_read_as_a_pickle(tmp_path: Path, size: int) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(_safetensors_with_header_of(size))
    assert detect_format(path) == "safetensors"
    assert load_state_dict(path)["w"].tolist() == [1.5]
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(CheckpointError, match=r"not a valid \.safetensors file"):
        load_state_dict(path)


def test_legacy_torch_format(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save(_state(), path, _use_new_zipfile_serialization=False)
    assert detect_format(path) == "torch"
    assert torch.equal(load_state_dict(path)["a.weight"], _state()["a.weight"])


def test_tied_tensors_are_written_to_safetensors(tmp_path: Path) -> None:
    shared = torch.ones(2, 2)
    big = torch.arange(12.0).reshape(6, 2)  # views of one storage, one of them transposed
    state = {"x": shared, "y": shared, "top": big[:2], "rest": big[2:], "t": big.t()}
    loaded = load_state_dict(save_state_dict(state, tmp_path / "t.safetensors"))
    for key, value in state.items():
        assert torch.equal(loaded[key], value), key


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"", "not a PyTorch state_dict file"),
        (b"hello, this is text", "not a PyTorch state_dict file"),
        (b"PK\x03\x04garbage", "cannot load"),
    ],
)
def test_unreadable_files(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "bad.pt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        load_state_dict(path)


def test_a_directory_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is a directory"):
        load_state_dict(tmp_path)


def test_truncated_safetensors(tmp_path: Path) -> None:
    path = save_state_dict(_state(), tmp_path / "t.safetensors")
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match=r"not a valid \.safetensors file"):
        load_state_dict(path)


def test_pickled_module_needs_trust(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)
    path = tmp_path / "model.pt"
    torch.save(model, path)
    with pytest.raises(CheckpointError, match="trust"):
        load_state_dict(path)
    loaded = load_state_dict(path, trust_pickle=True)
    assert torch.equal(loaded["weight"], model.weight.detach())


def test_entries_must_be_tensors(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    torch.save({"model": {"w": torch.ones(1)}, "epoch": 3}, path)
    with pytest.raises(CheckpointError, match="entry 'model' has type dict, not a tensor"):
        load_state_dict(path)
    torch.save([torch.ones(1)], path)
    with pytest.raises(CheckpointError, match="holds a list"):
        load_state_dict(path)


def test_save_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_state_dict(_state(), tmp_path / "m.pt")
    before = path.read_bytes()

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        save_state_dict({"other": torch.zeros(1)}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt"]


def test_save_needs_an_existing_folder(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        save_state_dict(_state(), tmp_path / "missing" / "m.pt")
    with pytest.raises(CheckpointError, match="is a directory"):
        save_state_dict(_state(), tmp_path)


def test_an_empty_path_is_refused_by_name_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Path('') is the current folder: the error names the call, the parameter and ''."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^save_state_dict: invalid path=''; expected a path"):
        save_state_dict(_state(), "")
    assert list(tmp_path.iterdir()) == []
