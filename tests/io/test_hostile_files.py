"""`prunekit report|prune` on malformed, truncated, hostile and oversized files.

Every such input gives one line on stderr and exit status 1; the input is never changed;
no output file appears (nor any other file beside it), and an output that existed keeps its
old content; no pickle runs code without --trust-pickle.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import resource
import signal
import struct
import subprocess
import sys
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import safetensors.torch as st
import torch

from prunekit.io import files
from prunekit.tools.cli import main

MARKER = "PRUNEKIT_HOSTILE_RAN"  # a file a hostile pickle would create


class RunsCode:
    """Unpickling this creates a marker file: code from the file ran."""

    def __init__(self, folder: Path) -> None:
        self.marker = str(folder / MARKER)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def torch_bytes(obj: object, **options: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, **options)  # type: ignore[arg-type]
    return buffer.getvalue()


def safetensors_bytes(header: object, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def good() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(6, 4, generator=g), "a.bias": torch.randn(6, generator=g)}


def f32(shape: list[int], end: int) -> dict[str, object]:
    return {"dtype": "F32", "shape": shape, "data_offsets": [0, end]}


def cases(folder: Path) -> dict[str, bytes]:
    """name -> content of every bad input."""
    pt, sf = torch_bytes(good()), st.save(good())
    legacy = torch_bytes(good(), _use_new_zipfile_serialization=False)
    return {
        "empty": b"",
        "text": b"weights: 1 2 3\n",
        "random bytes": bytes(range(256)) * 16,
        "torch, half of it": pt[: len(pt) // 2],
        "torch, all but the last byte": pt[:-1],
        "torch, first 100 bytes": pt[:100],
        "zip magic and zeros": b"PK\x03\x04" + bytes(100),
        "legacy torch, truncated": legacy[: len(legacy) - 10],
        "safetensors, length only": sf[:8],
        "safetensors, header cut": sf[:20],
        "safetensors, data cut": sf[:-5],
        "safetensors, length 2**63": struct.pack("<Q", 2**63) + b"{}",
        "safetensors, header not JSON": struct.pack("<Q", 5) + b"{abc}",
        "safetensors, header a list": safetensors_bytes([1, 2]),
        "safetensors, offsets past the end": safetensors_bytes({"w": f32([4], 16)}, bytes(8)),
        "safetensors, shape and offsets disagree": safetensors_bytes(
            {"w": f32([5], 16)}, bytes(16)
        ),
        "safetensors, unknown dtype": safetensors_bytes(
            {"w": {"dtype": "Q9", "shape": [4], "data_offsets": [0, 16]}}, bytes(16)
        ),
        "safetensors, shape 2**40 x 2**40": safetensors_bytes(
            {"w": f32([2**40, 2**40], 16)}, bytes(16)
        ),
        "safetensors, negative shape": safetensors_bytes({"w": f32([-4], 16)}, bytes(16)),
        "safetensors, overlapping tensors": safetensors_bytes(
            {"w": f32([4], 16), "v": f32([4], 16)}, bytes(16)
        ),
        "a list of tensors": torch_bytes([torch.ones(2)]),
        "a tensor": torch_bytes(torch.ones(2, 2)),
        "a training checkpoint (nested dicts)": torch_bytes({"model": good(), "epoch": 3}),
        "a sparse tensor": torch_bytes({"w": torch.eye(3).to_sparse()}),
        "a quantized tensor": torch_bytes(
            {"w": torch.quantize_per_tensor(torch.ones(2, 2), 0.1, 0, torch.qint8)}
        ),
        "a meta tensor": torch_bytes({"w": torch.empty(4, 4, device="meta")}),
        "legacy pickle that runs code": pickle.dumps(RunsCode(folder)),
        "torch zip with an object that runs code": torch_bytes(
            {"w": torch.ones(2, 2), "x": RunsCode(folder)}
        ),
        "a whole pickled model": torch_bytes(torch.nn.Linear(2, 2)),
    }


PRUNE_ONLY = {  # loadable files that prune refuses (report shows them)
    "NaN weights": torch_bytes({"w": torch.tensor([[float("nan"), 1.0], [2.0, 3.0]])}),
    "infinite weights": st.save({"w": torch.tensor([[float("inf"), 1.0], [2.0, 3.0]])}),
    "float8 weights": torch_bytes({"w": torch.randn(4, 4).to(torch.float8_e4m3fn)}),
    "no floating-point tensor": torch_bytes({"steps": torch.tensor([3, 4])}),
    "an empty state_dict": torch_bytes({}),
}

COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "report": lambda p, out: ["report", str(p)],
    "report --json": lambda p, out: ["report", str(p), "--json"],
    "report --plot": lambda p, out: ["report", str(p), "--plot", str(out.with_suffix(".png"))],
    "prune": lambda p, out: ["prune", str(p), "-o", str(out), "--amount", "0.5"],
    "prune --scope global --keep-masks": lambda p, out: [
        *["prune", str(p), "-o", str(out.with_suffix(".safetensors"))],
        *["--amount", "0.5", "--scope", "global", "--keep-masks"],
    ],
}


def listing(folder: Path) -> dict[str, str]:
    """Each entry of `folder` by name: the hash of a file's content; folders as such."""
    return {
        p.name: "folder" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_dir() or p.is_file()
    }


def refused(
    capsys: pytest.CaptureFixture[str], folder: Path, argv: list[str], *fragments: str
) -> str:
    """Run the command line; check it failed in one line and left every file as it was."""
    before = listing(folder)
    with warnings.catch_warnings(record=True) as caught:  # a warning is a line on stderr too
        warnings.simplefilter("always")
        code = main(argv)
    assert [str(w.message) for w in caught] == []
    out, err = capsys.readouterr()
    assert code == 1, (argv, out, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"prunekit {argv[0]}: error: ") and "Traceback" not in err
    assert err[:-1].isprintable(), err
    assert listing(folder) == before  # input unchanged, no output, no temporary file
    for fragment in fragments:
        assert fragment in err, err
    assert not (folder / MARKER).exists()
    return err


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(cases(Path("."))))
def test_bad_input_is_one_line_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str, command: str
) -> None:
    source = tmp_path / "input.bin"
    source.write_bytes(cases(tmp_path)[case])
    refused(capsys, tmp_path, COMMANDS[command](source, tmp_path / "out.pt"))


@pytest.mark.parametrize("case", list(PRUNE_ONLY))
def test_bad_weights_are_refused_by_prune(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str
) -> None:
    source = tmp_path / "input.pt"
    source.write_bytes(PRUNE_ONLY[case])
    (tmp_path / "out.pt").write_bytes(b"the old content")
    refused(capsys, tmp_path, COMMANDS["prune"](source, tmp_path / "out.pt"))
    assert (tmp_path / "out.pt").read_bytes() == b"the old content"
    assert main(["report", str(source)]) == 0  # while it can be shown


def test_float8_says_how_to_leave_it_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = tmp_path / "input.pt"
    source.write_bytes(torch_bytes({"w": torch.randn(4, 4).to(torch.float8_e5m2), **good()}))
    refused(capsys, tmp_path, COMMANDS["prune"](source, tmp_path / "out.pt"), "float8_e5m2")
    assert main([*COMMANDS["prune"](source, tmp_path / "out.pt"), "--exclude", "w"]) == 0


@pytest.mark.parametrize("command", ["report", "prune"])
def test_pickles_run_no_code_without_trust(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    for name in ("legacy pickle that runs code", "torch zip with an object that runs code"):
        source = tmp_path / "input.pt"
        source.write_bytes(cases(tmp_path)[name])
        argv = COMMANDS[command](source, tmp_path / "out.pt")
        refused(capsys, tmp_path, argv, "--trust-pickle")
        source.unlink()


@pytest.mark.parametrize("how", ["same path", "symlink", "hard link"])
def test_the_output_may_not_be_the_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, how: str
) -> None:
    source = tmp_path / "model.pt"
    source.write_bytes(torch_bytes(good()))
    out = tmp_path / "out.pt"
    if how == "same path":
        out = source
    elif how == "symlink":
        out.symlink_to(source)
    else:
        os.link(source, out)
    refused(capsys, tmp_path, COMMANDS["prune"](source, out), "is the input file itself")
    refused(capsys, tmp_path, ["report", str(source), "--plot", str(out)], "input file itself")


def test_output_folder_or_name_problems(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "model.pt"
    source.write_bytes(torch_bytes(good()))
    refused(capsys, tmp_path, COMMANDS["prune"](source, tmp_path / "missing" / "o.pt"))
    (tmp_path / "folder").mkdir()
    refused(capsys, tmp_path, COMMANDS["prune"](source, tmp_path / "folder"), "is a directory")
    refused(capsys, tmp_path, ["report", str(source), "--plot", str(tmp_path / "no" / "p.png")])


FIFO_RUN = """
import sys
from prunekit.tools.cli import main
fifo, out = sys.argv[1:]
codes = [main(["report", fifo]), main(["prune", fifo, "-o", out, "--amount", "0.5"])]
sys.exit(0 if codes == [1, 1] else 3)
"""


def test_input_that_is_not_a_regular_file(tmp_path: Path) -> None:
    """A FIFO is refused at once (opening it for reading would wait for a writer)."""
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    done = subprocess.run(
        [sys.executable, "-c", FIFO_RUN, str(fifo), str(tmp_path / "o.pt")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("not a regular file") == 2, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.pt"]


def test_directory_and_device_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    refused(capsys, tmp_path, ["report", str(tmp_path)], "a folder without model.safetensors")
    refused(capsys, tmp_path, ["report", "/dev/null"], "not a regular file")


HOSTILE_NAMES = {
    "[/]": torch.ones(2, 2),  # rich markup that fails to parse
    "[bold red]x[/bold red]": torch.zeros(2, 2),
    "title\x1b]0;set the terminal title\x07": torch.ones(2, 2),
    "two\nlines": torch.ones(3),
    "$\\frac{a}{b}$": torch.ones(2, 2),  # matplotlib math
}


def test_hostile_names_are_shown_as_text(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = tmp_path / "names.safetensors"
    st.save_file(HOSTILE_NAMES, source)
    assert main(["report", str(source), "--plot", str(tmp_path / "p.png")]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "\x1b" not in out
    for shown in ("[/]", "[bold red]x[/bold red]", r"title\x1b]0;", r"two\nlines", "$\\frac"):
        assert shown in out, shown
    assert (tmp_path / "p.png").read_bytes().startswith(b"\x89PNG")
    assert main(["report", str(source), "--json"]) == 0
    names = [row["name"] for row in json.loads(capsys.readouterr().out)["tensors"]]
    assert sorted(names) == sorted(HOSTILE_NAMES)
    before = listing(tmp_path)
    argv = ["prune", str(source), "-o", str(tmp_path / "o.pt"), "--amount", "5"]
    assert main([*argv, "--include", "title*"]) == 1  # 5 entries of 4: the name in the error
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err[:-1].isprintable() and listing(tmp_path) == before
    assert r"title\x1b]0;" in err


# --- oversized ------------------------------------------------------------------------------


def sparse_safetensors(path: Path, numel: int) -> None:
    """A safetensors file declaring one float32 tensor of `numel` entries, stored sparse."""
    header = json.dumps({"w": f32([numel], 4 * numel)}).encode()
    with open(path, "wb") as stream:
        stream.write(struct.pack("<Q", len(header)) + header)
        stream.truncate(8 + len(header) + 4 * numel)


def lying_zip(numel: int) -> bytes:
    """A torch.save zip whose directory says its data record unpacks to 4 GiB (a zip bomb's
    signature), while the file is a few KiB."""
    archive = zipfile.ZipFile(io.BytesIO(torch_bytes({"w": torch.zeros(numel)})))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as rebuilt:
        for info in archive.infolist():
            deflate = info.filename.endswith("/data/0")
            kind = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
            rebuilt.writestr(info.filename, archive.read(info.filename), compress_type=kind)
    data = bytearray(out.getvalue())
    central = data.index(b"PK\x01\x02")
    while True:  # each central directory entry: patch the data record's unpacked size
        name_length = struct.unpack_from("<H", data, central + 28)[0]
        name = bytes(data[central + 46 : central + 46 + name_length])
        if name.endswith(b"/data/0"):
            struct.pack_into("<I", data, central + 24, 0xFFFFFFFF)
            return bytes(data)
        central = data.index(b"PK\x01\x02", central + 4)


@pytest.mark.parametrize("command", ["report", "prune"])
def test_oversized_files_are_refused_before_loading(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    monkeypatch.setattr(files, "available_memory", lambda: 64 * 2**20)  # 64 MiB here
    source = tmp_path / "big.safetensors"
    sparse_safetensors(source, 2**25)  # 128 MiB of float32, none of it on disk
    argv = COMMANDS[command](source, tmp_path / "out.pt")
    refused(capsys, tmp_path, argv, "0.1 GiB once loaded", "0.1 GiB are available")
    source.unlink()
    bomb = tmp_path / "bomb.pt"
    bomb.write_bytes(lying_zip(16))
    refused(capsys, tmp_path, COMMANDS[command](bomb, tmp_path / "out.pt"), "4.0 GiB once")


def test_prune_needs_room_for_masks_and_output(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "model.safetensors"
    st.save_file({"w": torch.randn(1024, 1024)}, source)  # 4 MiB
    monkeypatch.setattr(files, "available_memory", lambda: 8 * 2**20)
    assert main(["report", str(source)]) == 0
    capsys.readouterr()
    refused(capsys, tmp_path, COMMANDS["prune"](source, tmp_path / "o.pt"), "needs about")


def limited_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


def test_the_address_space_limit_counts(tmp_path: Path) -> None:
    """Under ulimit -v 4 GiB a file declaring 6 GiB is refused by the check itself."""
    source = tmp_path / "big.safetensors"
    sparse_safetensors(source, 6 * 2**28)
    done = subprocess.run(
        [sys.executable, "-m", "prunekit", "report", str(source)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limited_memory,
    )
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "6.0 GiB once loaded" in done.stderr and "are available" in done.stderr


# --- killed mid-write -----------------------------------------------------------------------


def writes_in_progress(pid: int, folder: Path) -> list[str]:
    """Files under `folder` that process `pid` holds open (its output being written)."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith(str(folder)) and "input" not in target:
                found.append(target)
    return found


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_sigkill_mid_write_leaves_the_old_output(tmp_path: Path, suffix: str) -> None:
    source = tmp_path / "input.pt"
    torch.save({"w": torch.randn(4096, 6144)}, source)  # 96 MiB
    out = tmp_path / f"out{suffix}"
    out.write_bytes(b"the old content")
    process = subprocess.Popen(
        [sys.executable, "-m", "prunekit", "prune", str(source), "-o", str(out), "--amount", "0.5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    try:
        while not writes_in_progress(process.pid, tmp_path):
            assert process.poll() is None, "it finished before it was seen writing"
            assert time.monotonic() < deadline
            time.sleep(0.001)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert out.read_bytes() == b"the old content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input.pt", out.name]  # nothing else
