"""prunekit against torch.nn.utils.prune on the same work: times, peak memory and ratios.

    python benchmarks/run.py            # full sizes (make bench)
    python benchmarks/run.py --quick    # small sizes, seconds (make bench-quick)

Both libraries run in one process, alternating, each case repeated; the table
shows medians. Global pruning runs each side in its own subprocess. Peak
memory is the growth of the process's resident set during the call (the
kernel's high-water mark, reset before each call through /proc/self/clear_refs).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Large tensors must go back to the OS when freed, or memory peaks hide in the heap.
if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "131072":
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit

LIBS = {"torch": torch_prune, "prunekit": prunekit}
MIB = 1 << 20


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def measure(run: Callable[[], Any]) -> tuple[float, int, Any]:
    """Seconds, peak resident-set growth in bytes, and the result of `run()`."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # no reset allowed: peaks then include earlier ones (shown as growth 0)
    before = _status("VmRSS")
    start = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - start
    return seconds, max(_status("VmHWM") - before, 0), result


def linear(n_in: int, n_out: int, weight: torch.Tensor | None = None) -> nn.Linear:
    """A Linear layer without its (slow) default initialisation."""
    layer = nn.utils.skip_init(nn.Linear, n_in, n_out)
    with torch.no_grad():
        if weight is None:
            layer.weight.normal_()
        else:
            layer.weight.copy_(weight)
        layer.bias.zero_()
    return layer


@dataclass
class Row:
    name: str
    times: dict[str, list[float]] = field(default_factory=lambda: {"torch": [], "prunekit": []})
    peaks: dict[str, list[int]] = field(default_factory=lambda: {"torch": [], "prunekit": []})
    same: str | None = None
    note: str = ""


def same_masks(theirs: nn.Module, ours: nn.Module) -> str:
    """Over every pruned layer: 'yes' if the masks are equal; 'ties' if they differ only
    among equal |weights| (torch.topk breaks those ties arbitrarily, prunekit by index);
    else 'NO'."""
    verdict = "yes"
    for mine, other in zip(theirs.modules(), ours.modules(), strict=True):
        if not hasattr(mine, "weight_mask"):
            continue
        a, b = mine.weight_mask, other.weight_mask
        if torch.equal(a, b):
            continue
        differ = a != b
        values = mine.weight_orig.detach().abs()[differ]
        if not (bool((values == values[0]).all()) and int(a.sum()) == int(b.sum())):
            return "NO"
        verdict = "ties"
    return verdict


def run_case(
    name: str,
    setup: Callable[[Any], Any],
    work: Callable[[Any, Any], Any],
    check: bool,
    repeats: int,
) -> Row:
    """Time `work(lib, setup(lib))` for both libraries, alternating, `repeats` times each."""
    row = Row(name)
    for r in range(repeats):
        order = ["torch", "prunekit"] if r % 2 == 0 else ["prunekit", "torch"]
        results = {}
        for side in order:
            lib = LIBS[side]
            state = setup(lib)
            seconds, peak, _ = measure(lambda lib=lib, state=state: work(lib, state))
            row.times[side].append(seconds)
            row.peaks[side].append(peak)
            results[side] = state
        if check and r == 0:
            row.same = same_masks(results["torch"], results["prunekit"])
        del results
    return row


def single_cases(quick: bool, repeats: int) -> list[Row]:
    n = 256 if quick else 4096
    torch.manual_seed(0)
    base = torch.randn(n, n)
    conv_shape = (32, 32, 3, 3) if quick else (512, 512, 3, 3)
    conv_base = torch.randn(conv_shape)

    def fresh(lib: Any) -> nn.Linear:
        return linear(n, n, base)

    def pruned_once(lib: Any) -> nn.Linear:
        layer = fresh(lib)
        lib.l1_unstructured(layer, "weight", amount=0.3)
        return layer

    def conv(lib: Any) -> nn.Conv2d:
        layer = nn.utils.skip_init(nn.Conv2d, conv_shape[1], conv_shape[0], conv_shape[2])
        with torch.no_grad():
            layer.weight.copy_(conv_base)
        return layer

    size = f"{n}x{n}"
    return [
        run_case(
            f"l1_unstructured {size}",
            fresh,
            lambda lib, m: lib.l1_unstructured(m, "weight", amount=0.3),
            True,
            repeats,
        ),
        run_case(
            f"l1 again (container) {size}",
            pruned_once,
            lambda lib, m: lib.l1_unstructured(m, "weight", amount=0.3),
            True,
            repeats,
        ),
        run_case(
            f"random_unstructured {size}",
            fresh,
            lambda lib, m: lib.random_unstructured(m, "weight", amount=0.3),
            False,
            repeats,
        ),
        run_case(
            f"ln_structured Linear {size}",
            fresh,
            lambda lib, m: lib.ln_structured(m, "weight", amount=0.3, n=2, dim=0),
            True,
            repeats,
        ),
        run_case(
            f"ln_structured Conv2d {'x'.join(map(str, conv_shape))}",
            conv,
            lambda lib, m: lib.ln_structured(m, "weight", amount=0.3, n=1, dim=0),
            True,
            repeats,
        ),
    ]


def model_case(quick: bool, repeats: int) -> Row:
    """Every layer of a CNN with ResNet-18's weight shapes, pruned by one call each."""
    width = 8 if quick else 64
    torch.manual_seed(1)
    layers: list[nn.Module] = [nn.Conv2d(3, width, 7)]
    channels = width
    for stage in (width, 2 * width, 4 * width, 8 * width):
        for _ in range(4):
            layers.append(nn.Conv2d(channels, stage, 3))
            channels = stage
    layers.append(nn.Linear(channels, 1000))
    base = nn.Sequential(*layers)
    weights = sum(m.weight.numel() for m in layers)

    def work(lib: Any, model: nn.Sequential) -> None:
        for layer in model:
            lib.l1_unstructured(layer, "weight", amount=0.3)

    row = run_case(
        "l1 per layer, ResNet-18 shapes",
        lambda lib: copy.deepcopy(base),
        work,
        True,
        repeats,
    )
    row.note = f"{len(layers)} layers, {weights} weights, one l1_unstructured call each"
    return row


def forward_cases(quick: bool, repeats: int) -> list[Row]:
    """Per-call time of a pruned Linear against the same dense layer, batch 8."""
    n = 256 if quick else 4096
    calls = 5 if quick else 20
    torch.manual_seed(1)
    dense = linear(n, n)
    layers = {"dense": dense}
    for side, lib in LIBS.items():
        layers[side] = linear(n, n, dense.weight.detach())
        lib.l1_unstructured(layers[side], "weight", amount=0.5)
    x = torch.randn(8, n)

    def per_call(layer: nn.Module, grad: bool) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            if grad:
                layer.zero_grad(set_to_none=True)
                layer(x).square().sum().backward()
            else:
                with torch.no_grad():
                    layer(x)
        return (time.perf_counter() - start) / calls

    rows = []
    for grad, label in ((False, "no-grad forward"), (True, "training step (fwd+bwd)")):
        times: dict[str, list[float]] = {key: [] for key in layers}
        for layer in layers.values():
            per_call(layer, grad)  # warm-up
        for r in range(repeats * 3):
            keys = list(layers) if r % 2 == 0 else list(reversed(layers))
            for key in keys:
                times[key].append(per_call(layers[key], grad))
        row = Row(f"{label} Linear {n}x{n} b8")
        row.times = {"torch": times["torch"], "prunekit": times["prunekit"]}
        dense_ms = statistics.median(times["dense"]) * 1e3
        t_ratio = statistics.median(times["torch"]) * 1e3 / dense_ms
        p_ratio = statistics.median(times["prunekit"]) * 1e3 / dense_ms
        row.note = (
            f"dense {dense_ms:.2f} ms; vs dense: torch {t_ratio:.2f}x, prunekit {p_ratio:.2f}x"
        )
        rows.append(row)
    return rows


def global_child(spec: dict[str, Any]) -> None:
    """Build the model, prune it globally once, print seconds and peak growth as JSON."""
    lib = LIBS[spec["lib"]]
    dtype = getattr(torch, spec["dtype"])
    torch.manual_seed(2)
    layers = []
    for _ in range(spec["layers"]):
        layer = nn.utils.skip_init(nn.Linear, spec["width"], spec["width"], bias=False, dtype=dtype)
        with torch.no_grad():
            layer.weight.normal_()
        layers.append(layer)
    params = [(m, "weight") for m in layers]
    seconds, peak, _ = measure(
        lambda: lib.global_unstructured(params, pruning_method=lib.L1Unstructured, amount=0.2)
    )
    pruned = sum(int((m.weight_mask == 0).sum()) for m in layers)
    model = sum(m.weight_orig.numel() * m.weight_orig.element_size() for m in layers)
    masks = sum(m.weight_mask.numel() * m.weight_mask.element_size() for m in layers)
    digest = hashlib.sha1()
    for m in layers:
        digest.update((m.weight_mask != 0).numpy().tobytes())
    result = {"seconds": seconds, "peak": peak, "pruned": pruned, "model": model, "masks": masks}
    print(json.dumps({**result, "digest": digest.hexdigest()}))


def spawn(spec: dict[str, Any]) -> dict[str, Any] | str:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def global_case(quick: bool, repeats: int) -> Row:
    layers, width = (4, 128) if quick else (20, 2048)
    row = Row(f"global_unstructured {layers}x Linear({width},{width})")
    pruned: dict[str, tuple[int, str]] = {}
    model = 0
    masks: dict[str, int] = {}
    for r in range(repeats):
        order = ["torch", "prunekit"] if r % 2 == 0 else ["prunekit", "torch"]
        for side in order:
            spec = {"lib": side, "layers": layers, "width": width, "dtype": "float32"}
            result = spawn(spec)
            if isinstance(result, str):
                row.note = f"{side} failed: {result}"
                continue
            row.times[side].append(result["seconds"])
            row.peaks[side].append(result["peak"])
            pruned[side] = (result["pruned"], result["digest"])
            model = result["model"]
            masks[side] = result["masks"]
    if len(pruned) == 2:
        (count_t, digest_t), (count_p, digest_p) = pruned["torch"], pruned["prunekit"]
        row.same = "yes" if digest_t == digest_p else ("count" if count_t == count_p else "NO")
    sides = [s for s in LIBS if row.peaks[s]]
    if model and sides:
        peaks = {s: statistics.median(row.peaks[s]) for s in sides}
        # Both libraries keep the new masks, in the parameters' dtype: growth beyond them is
        # what the selection and the reparameterization's masked copies take.
        row.note = (
            f"model {model / MIB:.0f} MiB; peak growth / model: "
            + ", ".join(f"{s} {peaks[s] / model:.2f}x" for s in sides)
            + f"; of it the masks {masks[sides[0]] / model:.2f}x; beyond them: "
            + ", ".join(f"{s} {(peaks[s] - masks[s]) / model:.2f}x" for s in sides)
            + (f"; {row.note}" if row.note else "")
        )
    return row


def huge_global() -> Row:
    """prunekit alone on more than 2**31 bfloat16 weights (torch's concatenation cannot)."""
    row = Row("global_unstructured 2**31+ bf16 (prunekit only)")
    available = _meminfo("MemAvailable")
    need = 14 << 30
    if available < need:
        row.note = f"skipped: needs {need >> 30} GiB free, {available >> 30} GiB available"
        return row
    spec = {"lib": "prunekit", "layers": 9, "width": 16384, "dtype": "bfloat16"}
    result = spawn(spec)
    if isinstance(result, str):
        row.note = f"failed: {result}"
        return row
    row.times["prunekit"].append(result["seconds"])
    row.peaks["prunekit"].append(result["peak"])
    total = spec["layers"] * spec["width"] ** 2
    row.note = (
        f"{total} weights (2**31 = {2**31}); pruned {result['pruned']} "
        f"(expected {round(0.2 * total)}); model {result['model'] / MIB:.0f} MiB"
    )
    return row


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def table(rows: list[Row]) -> str:
    head = (
        f"{'case':44} {'torch ms':>10} {'prunekit ms':>12} {'speedup':>8} "
        f"{'torch MiB':>10} {'prunekit MiB':>13} {'mem ratio':>9} {'same mask':>9}"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        t = {s: statistics.median(v) * 1e3 if v else None for s, v in row.times.items()}
        m = {s: statistics.median(v) / MIB if v else None for s, v in row.peaks.items()}
        speed = t["torch"] / t["prunekit"] if t["torch"] and t["prunekit"] else None
        mem = m["torch"] / m["prunekit"] if m["torch"] and m["prunekit"] else None
        same = row.same or "-"
        lines.append(
            f"{row.name:44} {_fmt(t['torch'], 10, 2)} {_fmt(t['prunekit'], 12, 2)} "
            f"{_fmt(speed, 7, 1, 'x')} {_fmt(m['torch'], 10, 1)} {_fmt(m['prunekit'], 13, 1)} "
            f"{_fmt(mem, 8, 1, 'x')} {same:>9}"
        )
        if row.note:
            lines.append(f"    {row.note}")
    return "\n".join(lines)


def _fmt(value: float | None, width: int, digits: int, suffix: str = "") -> str:
    if value is None:
        return " " * (width - 1) + "-" + (" " if suffix else "")
    return f"{value:{width}.{digits}f}{suffix}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--repeats", type=int, default=None, help="runs per side and case")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        global_child(json.loads(args.child))
        return
    repeats = args.repeats or (2 if args.quick else 5)
    print(
        f"torch {torch.__version__}, prunekit {prunekit.__version__}, "
        f"{torch.get_num_threads()} threads, {'quick' if args.quick else 'full'} run, "
        f"medians of {repeats} alternating runs (global: {min(repeats, 3)}, one subprocess each)"
    )
    rows = single_cases(args.quick, repeats)
    rows.append(model_case(args.quick, repeats))
    rows.append(global_case(args.quick, min(repeats, 3)))
    rows += forward_cases(args.quick, repeats)
    if not args.quick:
        rows.append(huge_global())
    print(table(rows))


if __name__ == "__main__":
    main()
