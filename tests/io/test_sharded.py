"""prunekit.io.sharded: a sharded safetensors checkpoint pruned as one state_dict in memory."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
import torch

from prunekit.io.files import CheckpointError
from prunekit.io.mapped import read_header
from prunekit.io.sharded import INDEX, index_of, is_sharded, prune_sharded
from prunekit.io.statedict import prune_state_dict
from prunekit.tools.cli import main

st = pytest.importorskip("safetensors.torch")


def write_sharded(folder: Path, state: dict[str, torch.Tensor], per_file: int) -> Path:
    """Shards of `per_file` tensors each and an index, as Hugging Face lays them out."""
    folder.mkdir()
    names = list(state)
    files = [names[i : i + per_file] for i in range(0, len(names), per_file)]
    weight_map = {}
    for number, chunk in enumerate(files, 1):
        file = f"model-{number:05d}-of-{len(files):05d}.safetensors"
        st.save_file({n: state[n] for n in chunk}, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, file))
    index = {"metadata": {"total_size": 0}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX).write_text(json.dumps(index))
    return folder


def read_sharded(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors, in the order of the index's weight_map."""
    weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
    loaded: dict[str, dict[str, torch.Tensor]] = {}
    for file in dict.fromkeys(weight_map.values()):
        loaded[file] = st.load_file(str(folder / file))
    return {name: loaded[file][name] for name, file in weight_map.items()}


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Same names in the same order, dtypes, shapes and bits (-0.0 is not 0.0)."""
    assert list(got) == list(want)
    for name, tensor in want.items():
        other = got[name]
        assert other.dtype == tensor.dtype and other.shape == tensor.shape, name
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        view = bits[tensor.element_size()] if tensor.dtype != torch.bool else torch.bool
        assert torch.equal(other.view(view), tensor.view(view)), name


def model_state(large: bool = True) -> dict[str, torch.Tensor]:
    """Weights of several dtypes (more entries in all than the selection keeps without a
    sample when `large`), a pruned one saved with its mask, biases and an int buffer."""
    torch.manual_seed(0)
    rows = 300 if large else 12
    state = {
        "embed.weight": torch.randn(rows, 512).bfloat16(),
        "layers.0.attn.weight": torch.randn(rows, 256),
        "layers.0.attn.bias": torch.randn(rows),
        "layers.0.mlp.weight_orig": torch.randn(rows, 400).bfloat16(),
        "layers.0.mlp.weight_mask": (torch.rand(rows, 400) > 0.4).bfloat16(),
        "layers.1.attn.weight": torch.randn(rows, 256).half(),
        "layers.1.mlp.weight_orig": torch.randn(rows, 128),
        "layers.1.mlp.weight_mask": torch.rand(rows, 128) > 0.7,
        "layers.1.norm.weight": torch.ones(rows),
        "steps": torch.tensor([7]),
        "head.weight": torch.randn(10, rows).bfloat16(),
    }
    return state


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_sharded(tmp_path / "in", model_state(), per_file=3)


CASES = [
    ("l1", 0.6, {"global_pruning": True}),
    ("l1", 0.6, {"global_pruning": True, "keep_masks": True}),
    ("l1", 50_000, {"global_pruning": True}),
    ("random", 0.3, {"global_pruning": True, "seed": 3}),
    ("random", 0.3, {"global_pruning": True, "seed": 3, "keep_masks": True}),
    ("l1", 0.5, {}),
    ("random", 0.5, {"seed": 1}),
    ("ln", 0.25, {"n": 1, "dim": 1, "keep_masks": True}),
    ("l1", 0.9, {"include": ["layers.*"], "exclude": ["*.norm.*"]}),
]


@pytest.mark.parametrize(("method", "amount", "options"), CASES)
def test_equals_the_state_dict_pruned_in_memory(
    checkpoint: Path, tmp_path: Path, method: str, amount: float, options: dict[str, object]
) -> None:
    want = prune_state_dict(read_sharded(checkpoint), amount, method=method, **options)  # type: ignore[arg-type]
    done = prune_sharded(checkpoint, tmp_path / "out", amount, method=method, **options)  # type: ignore[arg-type]
    got = read_sharded(tmp_path / "out")
    assert_same(got, want.state)
    assert done.pruned == want.pruned
    assert done.index == tmp_path / "out" / INDEX


def test_small_checkpoint_and_count_amount(tmp_path: Path) -> None:
    folder = write_sharded(tmp_path / "in", model_state(large=False), per_file=4)
    for amount in (0, 1, 700, 0.0, 1.0):
        out = tmp_path / f"out{amount}"
        want = prune_state_dict(read_sharded(folder), amount, method="l1", global_pruning=True)
        prune_sharded(folder, out, amount, method="l1", global_pruning=True)
        assert_same(read_sharded(out), want.state)


def test_ties_everywhere_are_taken_in_index_order(tmp_path: Path) -> None:
    torch.manual_seed(1)
    state = {f"w{i}": torch.randint(-3, 4, (400, 300)).to(torch.bfloat16) for i in range(4)}
    folder = write_sharded(tmp_path / "in", state, per_file=1)
    for amount in (0.2, 0.5, 0.77):
        want = prune_state_dict(read_sharded(folder), amount, method="l1", global_pruning=True)
        prune_sharded(folder, tmp_path / "out", amount, method="l1", global_pruning=True)
        assert_same(read_sharded(tmp_path / "out"), want.state)


def test_output_files_and_index(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prune_sharded(checkpoint, out, 0.5, method="l1", global_pruning=True, keep_masks=True)
    index = json.loads((out / INDEX).read_text())
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted([INDEX, *set(index["weight_map"].values())])  # no temporary left
    total = 0
    for file in set(index["weight_map"].values()):
        found, metadata = read_header(out / file)
        assert metadata == {"format": "pt"}
        assert {n for n, f in index["weight_map"].items() if f == file} == set(found)
        total += sum(s.nbytes for s in found.values())
    assert index["metadata"]["total_size"] == total
    # A pruned tensor stays in its shard; a new mask goes beside it.
    source = json.loads((checkpoint / INDEX).read_text())["weight_map"]
    assert index["weight_map"]["embed.weight_orig"] == source["embed.weight"]
    assert index["weight_map"]["embed.weight_mask"] == source["embed.weight"]
    assert index["weight_map"]["layers.0.mlp.weight_mask"] == source["layers.0.mlp.weight_mask"]


def test_prunes_further_from_its_own_output(checkpoint: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    prune_sharded(checkpoint, first, 0.5, method="l1", global_pruning=True, keep_masks=True)
    want = prune_state_dict(read_sharded(first), 0.5, method="l1", global_pruning=True)
    prune_sharded(first / INDEX, second, 0.5, method="l1", global_pruning=True)
    assert_same(read_sharded(second), want.state)


def test_a_failure_leaves_the_output_as_it_was(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prune_sharded(checkpoint, out, 0.5, method="l1")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match=r"'head\.weight'"):
        prune_sharded(checkpoint, out, 3001, method="l1")  # more entries than head.weight holds
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(ValueError, match="amount"):
        prune_sharded(checkpoint, tmp_path / "new", 10**9, method="l1", global_pruning=True)
    assert not (tmp_path / "new").exists()


def test_scores_that_cannot_be_ranked(tmp_path: Path) -> None:
    state = model_state()
    state["layers.0.attn.weight"][3, 4] = float("nan")
    folder = write_sharded(tmp_path / "in", state, per_file=3)
    with pytest.raises(CheckpointError, match=r"'layers\.0\.attn\.weight'.*NaN"):
        prune_sharded(folder, tmp_path / "out", 0.5, method="l1", global_pruning=True)


def test_bad_checkpoints_and_options(checkpoint: Path, tmp_path: Path) -> None:
    assert is_sharded(checkpoint) and index_of(checkpoint / INDEX) == checkpoint / INDEX
    assert not is_sharded(tmp_path) and not is_sharded(tmp_path / "missing")
    with pytest.raises(CheckpointError, match=r"no model\.safetensors\.index\.json"):
        prune_sharded(tmp_path, tmp_path / "out", 0.5, method="l1")
    with pytest.raises(ValueError, match=r"^prune_sharded: method='ln' .*not scope='global'"):
        prune_sharded(checkpoint, tmp_path / "out", 0.5, method="ln", global_pruning=True)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / INDEX).write_text(json.dumps({"weight_map": {"w": "../elsewhere.safetensors"}}))
    with pytest.raises(CheckpointError, match="expected a file name"):
        prune_sharded(bad, tmp_path / "out", 0.5, method="l1")
    (bad / INDEX).write_text(json.dumps({"weight_map": {"w": "x.safetensors"}}))
    (bad / "x.safetensors").write_bytes(b'\x08\x00\x00\x00\x00\x00\x00\x00{"a":1} ')
    with pytest.raises(CheckpointError, match="malformed"):
        prune_sharded(bad, tmp_path / "out", 0.5, method="l1")
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="is a file"):
        prune_sharded(checkpoint, tmp_path / "file", 0.5, method="l1")


def test_command_line(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    status = main(["prune", str(checkpoint), "-o", str(out), "--amount", "0.75", "--global"])
    assert status == 0
    printed = capsys.readouterr().out
    assert "Pruned 6 tensors" in printed and "globally" in printed and str(out) in printed
    want = prune_state_dict(read_sharded(checkpoint), 0.75, method="l1", global_pruning=True)
    assert_same(read_sharded(out), want.state)


def raw_safetensors(path: Path, metadata: object) -> None:
    """One float32 tensor 'w' of 4 values, with `metadata` as the header's __metadata__."""
    header = {
        "__metadata__": metadata,
        "w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
    }
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(16))


@pytest.mark.parametrize(
    "metadata, words",
    [
        (["format", "pt"], r"__metadata__ is a list; expected a mapping of strings to strings"),
        ("pt", r"__metadata__ is a str; expected a mapping of strings to strings"),
        (
            {"nested": {"a": 1}},
            r"__metadata__\['nested'\] is a dict \(\{\"a\": 1\}\); expected a str",
        ),
        ({"n": 3}, r"__metadata__\['n'\] is a int \(3\); expected a string"),
    ],
)
def test_shard_metadata_that_is_not_strings_is_refused(
    tmp_path: Path, metadata: object, words: str
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / INDEX).write_text(json.dumps({"weight_map": {"w": "x.safetensors"}}))
    raw_safetensors(bad / "x.safetensors", metadata)
    with pytest.raises(CheckpointError, match=r"x\.safetensors: the header's " + words):
        prune_sharded(bad, tmp_path / "out", 0.5, method="l1", include=["w"])
    assert not (tmp_path / "out").exists()
    raw_safetensors(bad / "x.safetensors", {"format": "pt"})
    assert read_header(bad / "x.safetensors")[1] == {"format": "pt"}


def test_an_index_that_is_a_fifo_is_not_a_regular_file(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    folder.mkdir()
    os.mkfifo(folder / INDEX)
    for where in (folder, folder / INDEX):
        with pytest.raises(CheckpointError, match=r"index\.json: is not a regular file; expected"):
            prune_sharded(where, tmp_path / "out", 0.5, method="l1")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("refusal", [errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP])
def test_tensors_copied_as_they_are_across_filesystems(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    """copy_file_range refuses files on two filesystems (EXDEV since Linux 5.19, a shard on
    tmpfs and the output on disk), or on a filesystem without it: the bytes are copied by
    reading and writing instead."""

    def refused(*args: object) -> int:
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(os, "copy_file_range", refused, raising=False)
    want = prune_state_dict(read_sharded(checkpoint), 0.5, method="l1", include=["layers.*"])
    prune_sharded(checkpoint, tmp_path / "out", 0.5, method="l1", include=["layers.*"])
    assert_same(read_sharded(tmp_path / "out"), want.state)


def test_the_output_gets_the_permissions_of_any_new_folder_and_file(
    checkpoint: Path, tmp_path: Path
) -> None:
    """As mkdir and open make them (the umask applied), not private to the owner as
    temporary files are: another user or group the umask lets read can load the shards."""
    before = os.umask(0o022)
    try:
        prune_sharded(checkpoint, tmp_path / "out", 0.5, method="l1")
        (tmp_path / "plain").mkdir()
        (tmp_path / "plain" / "file").write_bytes(b"")
    finally:
        os.umask(before)

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(tmp_path / "out") == mode(tmp_path / "plain") == 0o755
    for path in (tmp_path / "out").iterdir():
        assert mode(path) == mode(tmp_path / "plain" / "file") == 0o644, path.name


def test_a_config_is_the_keywords_in_one_object(checkpoint: Path, tmp_path: Path) -> None:
    from prunekit.whole import Config

    config = Config(method="random", amount=0.3, scope="global", exclude=("embed.*",))
    done = prune_sharded(checkpoint, tmp_path / "a", config=config, seed=3, keep_masks=True)
    want = prune_sharded(
        checkpoint, tmp_path / "b", 0.3, method="random", scope="global", exclude=["embed.*"],
        seed=3, keep_masks=True,
    )  # fmt: skip
    assert (done.pruned, done.numel, done.zeros) == (want.pruned, want.numel, want.zeros)
    assert_same(read_sharded(tmp_path / "a"), read_sharded(tmp_path / "b"))
    with pytest.warns(FutureWarning, match="prune_sharded: the method as a positional"):
        prune_sharded(checkpoint, tmp_path / "c", "l1", 0.5)  # type: ignore[arg-type]
    assert_same(read_sharded(tmp_path / "c"), prune_state_dict(read_sharded(checkpoint), 0.5).state)


def test_an_empty_out_is_refused_by_name_before_a_shard_is_read(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Path('') is the current folder, which took the shards and index unasked."""
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "kept.txt").write_text("kept")
    monkeypatch.chdir(tmp_path / "here")
    with pytest.raises(ValueError, match=r"^prune_sharded: invalid out=''; expected a path"):
        prune_sharded(checkpoint, "", 0.5)
    with pytest.raises(ValueError, match=r"^prune_sharded: invalid out=''"):
        prune_sharded(tmp_path / "missing", "", 0.5)  # before the input is read
    assert [p.name for p in (tmp_path / "here").iterdir()] == ["kept.txt"]
