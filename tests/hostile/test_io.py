"""Hostile cases for the checkpoint readers and writers (prunekit.io: sharded, mapped): what
is read is what the file holds now, and a sharded checkpoint prunes as prune_state_dict
prunes the same tensors in one dict."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hostile.support import refused
from prunekit.io.sharded import INDEX, open_tensors, prune_sharded
from prunekit.io.statedict import prune_state_dict

st = pytest.importorskip("safetensors.torch")


def shards(folder: Path, state: dict[str, torch.Tensor]) -> Path:
    """Each tensor of `state` in a shard of its own, and an index in the order of `state`."""
    folder.mkdir()
    where = {}
    for number, name in enumerate(state, 1):
        file = f"model-{number:05d}-of-{len(state):05d}.safetensors"
        st.save_file({name: state[name]}, str(folder / file), metadata={"format": "pt"})
        where[name] = file
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": where}))
    return folder


def written(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of a sharded folder, read by safetensors itself (no prunekit code)."""
    weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
    return {name: st.load_file(str(folder / file))[name] for name, file in weight_map.items()}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bits of a float tensor (NaN equal to itself, -0.0 apart from 0.0)."""
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def state(dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(6, 4, generator=g).to(dtype),
        "b.weight": torch.randn(5, 4, generator=g).to(dtype),
    }


# --- a file replaced while tensors of it are held --------------------------------------------


def test_a_folder_written_again_is_read_as_it_is_now(tmp_path: Path) -> None:
    """Tensors of an output held (a dict of open_tensors), the output pruned again further:
    open_tensors read the first output's values again (the memory maps were found by path
    and offset, the replaced file's map still alive), 6 zeros where the file holds 18."""
    source = shards(tmp_path / "in", state())
    out = tmp_path / "out"
    prune_sharded(source, out, 0.25, method="l1")
    held = {k: v for entry in open_tensors(out) for k, v in entry.items()}
    assert int((held["a.weight"] == 0).sum()) == 6
    prune_sharded(source, out, 0.75, method="l1")
    again = {k: v for entry in open_tensors(out) for k, v in entry.items()}
    on_disk = written(out)
    assert int((on_disk["a.weight"] == 0).sum()) == 18
    for name, tensor in on_disk.items():
        assert torch.equal(again[name], tensor), name
    assert int((held["a.weight"] == 0).sum()) == 6  # the held tensors are as they were read


def test_a_folder_written_again_is_pruned_from_what_it_holds_now(tmp_path: Path) -> None:
    """The same through prune_sharded: a folder read while tensors of it are held, then
    written anew, pruned again from its new values (it pruned the old ones)."""
    first, second = tmp_path / "first", tmp_path / "second"
    shards(first, state())
    held = {k: v for entry in open_tensors(first) for k, v in entry.items()}
    new = {k: v * 2 + 1 for k, v in state().items()}
    for name, file in json.loads((first / INDEX).read_text())["weight_map"].items():
        st.save_file({name: new[name]}, str(first / f".{file}"), metadata={"format": "pt"})
        (first / f".{file}").replace(first / file)  # a new file at the same name
    prune_sharded(first, second, 0.5, method="l1")
    want = prune_state_dict(new, 0.5, method="l1").state
    got = written(second)
    for name, tensor in want.items():
        assert torch.equal(bits(got[name]), bits(tensor)), name
    assert torch.equal(held["a.weight"], state()["a.weight"])


# --- what lies behind a saved mask ------------------------------------------------------------


@pytest.mark.parametrize("keep_masks", [False, True], ids=["permanent", "keep-masks"])
@pytest.mark.parametrize("behind", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_global_pruning_ranks_what_a_saved_mask_left_as_in_memory(
    tmp_path: Path, keep_masks: bool, behind: float, dtype: torch.dtype
) -> None:
    """A tensor saved pruned (``_orig`` + ``_mask``) whose pruned entries hold NaN or inf:
    prune_state_dict ranks the entries its mask left, in scope 'global' too; prune_sharded
    refused it ('tensors 'a.weight' hold NaN or infinity, which cannot be ranked')."""
    tensors = state(dtype)
    orig, mask = tensors.pop("a.weight"), torch.ones(6, 4, dtype=dtype)
    mask[0, :2] = 0
    orig[0, :2] = behind
    saved = {"a.weight_orig": orig, "a.weight_mask": mask, **tensors}
    want = prune_state_dict(saved, 0.5, method="l1", scope="global", keep_masks=keep_masks)
    source = shards(tmp_path / "in", saved)
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    result = prune_sharded(
        source, tmp_path / "out", 0.5, method="l1", scope="global", keep_masks=keep_masks
    )
    got = written(tmp_path / "out")
    assert list(got) == list(want.state)
    for name, tensor in want.state.items():
        assert torch.equal(bits(got[name]), bits(tensor)), name
    assert result.pruned == want.pruned
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before


def test_nan_a_saved_mask_left_is_still_refused_before_the_output_changes(tmp_path: Path) -> None:
    """A NaN in an entry the saved mask keeps competes and cannot be ranked: refused by
    name, the output folder not made (the guard beside the fix above)."""
    tensors = state()
    orig, mask = tensors.pop("a.weight"), torch.ones(6, 4)
    mask[0, 0] = 0
    orig[1, 1] = math.nan
    source = shards(tmp_path / "in", {"a.weight_orig": orig, "a.weight_mask": mask, **tensors})
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"'a\.weight' hold NaN or infinity"):
        prune_sharded(source, out, 0.5, method="l1", scope="global")
    assert not out.exists()


# --- a saved mask that is no mask -------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "exclude"),
    [("global", ()), ("layer", ("a",)), ("global", ("a",))],
    ids=["global", "layer-left", "global-left"],
)
@pytest.mark.parametrize("value", [0.5, math.nan, 2.0], ids=["half", "nan", "two"])
def test_a_saved_mask_that_is_no_mask_is_named_with_its_value_and_place(
    tmp_path: Path, scope: str, exclude: tuple[str, ...], value: float
) -> None:
    """A ``_mask`` holding 0.5 (NaN, 2): prune_state_dict names the tensor, the value and its
    index; prune_sharded said only "'a.weight_mask' holds values other than 0 and 1" where
    the tensor was ranked with others or left out. The output stays as it was."""
    mask = torch.ones(6, 4)
    mask[5, 3] = value
    saved = {
        "z.weight": torch.randn(4, 4),
        "a.weight_orig": torch.randn(6, 4),
        "a.weight_mask": mask,
    }
    message = rf"tensor 'a\.weight': the mask .*{value} at index \(5, 3\); expected only 0 and 1"
    options: dict[str, object] = {"method": "l1", "scope": scope, "exclude": exclude}
    with pytest.raises(ValueError, match=message):
        prune_state_dict(saved, 0.5, **options)  # type: ignore[arg-type]
    source = shards(tmp_path / "in", saved)
    out = tmp_path / "out"
    out.mkdir()
    (out / "model-00001-of-00003.safetensors").write_bytes(b"an earlier output")
    refused(
        lambda: prune_sharded(source, out, 0.5, **options),  # type: ignore[arg-type]
        ValueError,
        message,
        paths=(source, out),
    )
