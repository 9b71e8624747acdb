"""`prunekit prune --scope global` on a sharded bf16 safetensors checkpoint larger than memory.

    python benchmarks/sharded.py               # 26 GB, after a 0.3 GB side-by-side case
    python benchmarks/sharded.py --quick       # the 0.3 GB case only
    python benchmarks/sharded.py --size 8      # another size, in GB

The benchmark writes a synthetic checkpoint shaped like a 13B-parameter decoder (layers
are added or dropped to reach the size; 5 GB shards, a model.safetensors.index.json, as
Hugging Face saves it), prunes it with the command line in a subprocess, and prints wall
time and the subprocess's peak resident set. Both checkpoints are deleted at the end,
also on failure. On the side-by-side case the peer is torch.nn.utils.prune, which needs
the model in memory: every shard loaded, global_unstructured, the shards saved again.
torch's global path concatenates the scores and takes a topk of them: it peaks near 17x
the model's size (a 2 GB checkpoint is killed for want of memory here), so the
side-by-side case is small, and at the large size only prunekit runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from prunekit.io.mapped import Planned, Writer
from prunekit.io.sharded import INDEX

GB = 10**9
GIB = 1 << 30
HIDDEN, FFN, VOCAB = 5120, 13824, 32000
SHARD = 5 * GB
MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
# Prepended to each subprocess: writes its peak resident set at exit. (VmHWM belongs to the
# process image: the fork of this process that precedes exec does not count, as it would
# in the child's ru_maxrss.)
HWM = r"""
import atexit, os
def _hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            open(os.environ["BENCH_HWM"], "w").write(line.split()[1])
atexit.register(_hwm)
"""
CLI = "import sys\nfrom prunekit.tools.cli import main\nsys.exit(main(sys.argv[1:]))\n"
PEER = r"""
import json, sys, time, torch
import torch.nn.utils.prune as prune
from safetensors.torch import load_file, save_file
from torch import nn
src, dst, amount = sys.argv[1], sys.argv[2], float(sys.argv[3])
weight_map = json.load(open(f"{src}/model.safetensors.index.json"))["weight_map"]
state = {}
for file in dict.fromkeys(weight_map.values()):
    state.update(load_file(f"{src}/{file}"))
holders, pairs = {}, []
for name, t in state.items():
    if t.dim() >= 2:
        holder = nn.Module()
        holder.w = nn.Parameter(t, requires_grad=False)
        holders[name] = holder
        pairs.append((holder, "w"))
prune.global_unstructured(pairs, prune.L1Unstructured, amount=amount)
for name, holder in holders.items():
    prune.remove(holder, "w")
    state[name] = holder.w.detach()
for file in dict.fromkeys(weight_map.values()):
    save_file({n: state[n] for n, f in weight_map.items() if f == file}, f"{dst}/{file}")
"""


def layout(size: float) -> list[tuple[str, tuple[int, ...]]]:
    """Tensor names and shapes of a decoder whose bf16 weights take about `size` bytes."""
    layer = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN + 2 * HIDDEN
    layers = max(1, round((size / 2 - 2 * VOCAB * HIDDEN) / layer))
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        at = f"model.layers.{i}."
        shapes += [(f"{at}self_attn.{p}_proj.weight", (HIDDEN, HIDDEN)) for p in "qkvo"]
        shapes += [(f"{at}mlp.{p}_proj.weight", (FFN, HIDDEN)) for p in ("gate", "up")]
        shapes += [(f"{at}mlp.down_proj.weight", (HIDDEN, FFN))]
        shapes += [(f"{at}{n}_layernorm.weight", (HIDDEN,)) for n in ("input", "post_attention")]
    shapes += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    return shapes


def scale(
    shapes: list[tuple[str, tuple[int, ...]]], size: float
) -> list[tuple[str, tuple[int, ...]]]:
    """The same names, every dimension of 2-D weights scaled so the total is about `size`."""
    total = sum(2 * _numel(s) for _, s in shapes)
    if total <= size * 1.5:
        return shapes
    f = (size / total) ** 0.5
    return [(n, tuple(max(8, round(d * f)) for d in s)) for n, s in shapes]


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def make(folder: Path, size: float) -> tuple[int, int]:
    """Write the checkpoint tensor by tensor (never a shard in memory); return its bytes
    and the largest shard's."""
    shapes = scale(layout(size), size)
    files: dict[str, list[Planned]] = {}
    current, used = 1, 0
    for name, shape in shapes:
        nbytes = 2 * _numel(shape)
        if used and used + nbytes > SHARD:
            current, used = current + 1, 0
        files.setdefault(f"{current}", []).append(Planned(name, "BF16", shape))
        used += nbytes
    count = len(files)
    named = {f"model-{int(k):05d}-of-{count:05d}.safetensors": v for k, v in files.items()}
    folder.mkdir()
    writer = Writer(folder, named, {file: {"format": "pt"} for file in named})
    generator = torch.Generator().manual_seed(0)
    for plans in named.values():
        for plan in plans:
            n = _numel(plan.shape)
            for start in range(0, n, 1 << 26):
                part = torch.randn(min(1 << 26, n - start), generator=generator)
                writer.write(plan.name, start, part.mul_(0.02).to(torch.bfloat16))
    writer.commit()
    weight_map = {p.name: file for file, plans in named.items() for p in plans}
    index = {"metadata": {"total_size": sum(writer.sizes.values())}, "weight_map": weight_map}
    (folder / INDEX).write_text(json.dumps(index, indent=2))
    return sum(writer.sizes.values()), max(writer.sizes.values())


def run(code: str, args: list[str], threads: int) -> tuple[float, int]:
    """Wall seconds and peak resident set (bytes) of Python `code` run in a subprocess."""
    with tempfile.NamedTemporaryFile("r") as hwm:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "BENCH_HWM": hwm.name}
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", HWM + code, *args], env=env, check=False)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{code.strip().splitlines()[-1][:60]}: failed ({done.returncode})")
        return seconds, int(hwm.read()) * 1024


def zeros_count(folder: Path) -> tuple[int, int]:
    """Zeros and entries of the 2-D weights of a written checkpoint, read tensor by tensor."""
    from prunekit.io.sharded import _open  # the same reader as the command

    zeros = numel = 0
    for stored in _open(folder).tensors.values():
        if len(stored.shape) >= 2:
            bits = stored.load().reshape(-1).view(torch.int16) & 0x7FFF  # -0.0 counts too
            zeros, numel = zeros + bits.numel() - int(bits.count_nonzero()), numel + bits.numel()
            del bits
    return zeros, numel


def case(root: Path, size: float, amount: float, peer: bool, threads: int) -> None:
    source, out = root / "in", root / "out"
    try:
        start = time.perf_counter()
        total, largest = make(source, size)
        made = time.perf_counter() - start
        print(
            f"\ncheckpoint: {total / GB:.1f} GB bf16 in {len(list(source.glob('*.safetensors')))} "
            f"shards (largest {largest / GB:.2f} GB), written in {made:.0f} s; "
            f"machine memory {MEMORY / GIB:.1f} GiB"
        )
        base = run("import prunekit.tools.cli", [], threads)[1]
        command = [
            "prune",
            str(source),
            "-o",
            str(out),
            "--amount",
            str(amount),
            "--scope",
            "global",
        ]
        seconds, peak = run(CLI, command, threads)
        rows = [("prunekit prune --scope global (streamed)", seconds, peak)]
        zeros, numel = zeros_count(out)
        if peer:
            shutil.rmtree(out)
            out.mkdir()
            measured = run(PEER, [str(source), str(out), str(amount)], threads)
            rows.append(("torch global_unstructured (in memory)", *measured))
        print(f"threads: {threads}")
        print(
            f"{'':40} {'seconds':>9} {'peak RSS':>12} {'above start':>12} {'/ largest shard':>16}"
        )
        for label, s, p in rows:
            print(
                f"{label:40} {s:9.1f} {p / GIB:8.2f} GiB {(p - base) / GIB:8.2f} GiB "
                f"{(p - base) / largest:16.2f}"
            )
        if peer:
            (_, s0, p0), (_, s1, p1) = rows
            print(
                f"{'ratio prunekit / torch':40} {s0 / s1:9.2f} {p0 / p1:12.2f} "
                f"{(p0 - base) / (p1 - base):12.2f}"
            )
        else:
            print("torch global_unstructured: not run, the model does not fit in memory")
        print(f"start: the interpreter with prunekit imported, {base / GIB:.2f} GiB")
        print(
            f"zeros among the 2-D weights after --amount {amount}: {zeros:,} of {numel:,} "
            f"(round(amount x entries) = {round(amount * numel):,})"
        )
    finally:
        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=float, default=26.0, help="GB of the large case")
    parser.add_argument("--quick", action="store_true", help="the 0.3 GB side-by-side case only")
    parser.add_argument("--amount", type=float, default=0.5)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per run (default 1: shared machine)"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="prunekit-sharded-", dir=args.dir))
    try:
        sizes = [(0.3, True)] if args.quick else [(0.3, True), (args.size, False)]
        for size, peer in sizes:
            need = 2 * size * GB + (size * GB if peer else 0)
            free = shutil.disk_usage(root).free
            if need > free * 0.95:
                raise SystemExit(
                    f"{size} GB needs {need / GB:.0f} GB of disk, {free / GB:.0f} free"
                )
            case(root, size * GB, args.amount, peer, args.threads)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
