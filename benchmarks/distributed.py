"""Global L1 pruning of one model over 1, 2 and 4 processes (gloo, CPU): time, per-rank
peak memory and bytes exchanged, beside torch.nn.utils.prune in one process.

    python benchmarks/distributed.py            # 64M float32 entries (make bench-distributed)
    python benchmarks/distributed.py --quick    # 8M entries

The model is the same at every size: 16 Linear weights. Each rank builds only what it
holds: its layers ("layers": rank r holds layers r*16/n ... ) or a Shard(0) DTensor of
every weight ("shards", as FSDP2 holds them), so the memory per rank falls with the
ranks. A rank's time is its global_unstructured call (the slowest rank is shown); its
peak is the growth of its resident set during the call (VmHWM, reset before through
/proc/self/clear_refs). Bytes are what the rank handed to the collectives. torch runs in
one process on the whole model: it concatenates the scores, so it peaks at several times
the model's size. On this 2-core machine, 4 ranks share 2 cores: time per rank does not
fall below the 2-rank time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Large tensors must go back to the OS when freed, or memory peaks hide in the heap.
if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "131072":
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

MIB = 1 << 20
LAYERS = 16


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def weight(index: int, rows: int, cols: int) -> torch.Tensor:
    """Layer `index`'s weight, the same in every process."""
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(index))


def holder(t: torch.Tensor) -> nn.Module:
    layer = nn.Module()
    layer.weight = nn.Parameter(t, requires_grad=False)
    return layer


def measure(run: Any) -> tuple[float, int]:
    _reset_peak()
    before = _status("VmRSS")
    start = time.perf_counter()
    run()
    return time.perf_counter() - start, max(_status("VmHWM") - before, 0)


def rank_main(rank: int, world: int, folder: str, mode: str, rows: int, cols: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rdv", rank=rank, world_size=world)
    import prunekit
    from prunekit.distributed import collectives as groups

    sent = [0]
    for name in ("sum", "gather", "first"):
        real = getattr(groups.TorchGroup, name)

        def counted(self: Any, values: torch.Tensor, real: Any = real) -> Any:
            sent[0] += values.numel() * values.element_size()
            return real(self, values)

        setattr(groups.TorchGroup, name, counted)
    real_objects = groups.TorchGroup.objects

    def objects(self: Any, value: Any) -> Any:
        import pickle

        sent[0] += len(pickle.dumps(value))
        return real_objects(self, value)

    groups.TorchGroup.objects = objects  # type: ignore[method-assign]
    if mode == "layers":
        mine = range(rank * LAYERS // world, (rank + 1) * LAYERS // world)
        layers = [holder(weight(i, rows, cols)) for i in mine]
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        layers = []
        for i in range(LAYERS):
            full = weight(i, rows, cols)
            layers.append(holder(distribute_tensor(full, mesh, [Shard(0)])))
            del full
    held = sum(
        p.to_local().numel() if hasattr(p, "to_local") else p.numel()
        for layer in layers
        for p in [layer.weight]
    )
    pairs = [(layer, "weight") for layer in layers]
    dist.barrier()
    seconds, peak = measure(
        lambda: prunekit.global_unstructured(
            pairs, prunekit.L1Unstructured, amount=0.7, process_group=dist.group.WORLD
        )
    )
    zeros = sum(
        int((layer.weight_mask.to_local() if mode == "shards" else layer.weight_mask).numel())
        - int((layer.weight_mask.to_local() if mode == "shards" else layer.weight_mask).sum())
        for layer in layers
    )
    torch.save(
        {"seconds": seconds, "peak": peak, "sent": sent[0], "held": held * 4, "zeros": zeros},
        Path(folder) / f"rank{rank}.pt",
    )
    dist.destroy_process_group()


def run_group(world: int, mode: str, rows: int, cols: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(
            rank_main, args=(world, folder, mode, rows, cols), nprocs=world, start_method="spawn"
        )
        return [torch.load(Path(folder) / f"rank{r}.pt") for r in range(world)]


def one_process(lib: str, rows: int, cols: int) -> tuple[float, int]:
    """torch or prunekit global_unstructured on the whole model, here."""
    import torch.nn.utils.prune as torch_prune

    import prunekit

    module = torch_prune if lib == "torch" else prunekit
    layers = [holder(weight(i, rows, cols)) for i in range(LAYERS)]
    pairs = [(layer, "weight") for layer in layers]
    return measure(lambda: module.global_unstructured(pairs, module.L1Unstructured, amount=0.7))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8M entries instead of 64M")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    rows, cols = (512, 1024) if args.quick else (2048, 2048)
    total = LAYERS * rows * cols
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    print(
        f"model: {LAYERS} weights of {rows}x{cols} float32, {total:,} entries "
        f"({total * 4 / MIB:.0f} MiB); amount 0.7; 1 thread per process"
    )
    rows_out = []
    for lib in ("torch", "prunekit"):
        found = [one_process(lib, rows, cols) for _ in range(args.repeats)]
        rows_out.append(
            (
                f"{lib}, one process",
                1,
                statistics.median(s for s, _ in found),
                max(p for _, p in found),
                0,
                total * 4,
            )
        )
    for mode in ("layers", "shards"):
        for world in (1, 2, 4):
            runs = [run_group(world, mode, rows, cols) for _ in range(args.repeats)]
            zeros = sum(r["zeros"] for r in runs[0])
            assert zeros == round(0.7 * total), (zeros, round(0.7 * total))
            seconds = statistics.median(max(r["seconds"] for r in ranks) for ranks in runs)
            peak = max(r["peak"] for ranks in runs for r in ranks)
            sent = max(r["sent"] for r in runs[0])
            held = max(r["held"] for r in runs[0])
            rows_out.append((f"prunekit, {mode}", world, seconds, peak, sent, held))
    base_s, base_p = rows_out[0][2], rows_out[0][3]
    head = (
        f"{'':26} {'ranks':>5} {'seconds':>8} {'peak/rank':>10} {'held/rank':>10} "
        f"{'sent/rank':>10} {'time/torch':>10} {'peak/torch':>10}"
    )
    print(head)
    for label, world, s, p, sent, held in rows_out:
        print(
            f"{label:26} {world:5} {s:8.2f} {p / MIB:6.0f} MiB {held / MIB:6.0f} MiB "
            f"{sent / 1024:6.0f} KiB {s / base_s:10.2f} {p / base_p:10.2f}"
        )
    print(
        "peak/rank: growth of the resident set during the call; held/rank: the weights the "
        "rank holds; sent/rank: bytes the rank gave the collectives in the call"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
