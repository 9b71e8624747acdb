"""SparseGPT and Wanda beside llm-compressor on every domain: one run, one table of ratios.

    python benchmarks/domains_llmcompressor.py          # make bench-llmcompressor-domains
    python benchmarks/domains_llmcompressor.py --calibrate prose --cases sparsegpt:2:4

SmolLM2-135M-Instruct (as ``benchmarks/vs_llmcompressor.py`` loads it and starts
llm-compressor 0.14 in its own venv): every Linear weight of the blocks at 50 %, calibrated
by both libraries on the same --calibration x --length tokens of the calibration documents
of ``benchmarks/domains.py`` (--calibrate: one domain, or 'mixture', an even share of each),
then scored by the same code: perplexity over --windows x 512 tokens of each domain's
evaluation documents (disjoint from the calibration ones).

Cases, each ``method:pattern`` as prunekit names it; llm-compressor prunes the same way:
SparseGPT 'unstructured' is 50 % of every block of 128 columns on both sides (the
selection llm-compressor makes, which prunekit's sweep makes for ``Unstructured``), Wanda
'row' is 50 % of every output row (llm-compressor's mask structure '0:0'), '2:4' is 2 of
every 4 inputs. A cell is prunekit's perplexity over llm-compressor's on that domain (below
1.000x: prunekit is better); 'worst' is each row's largest ratio, and the last line the
worst of all cells.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
from torch import Tensor, nn

import llm_structure
import vs_llmcompressor as vs
from domains import NAMES, domains
from domains_llm import calibration_windows, perplexity, spread, token_ids

CASES = "sparsegpt:unstructured,sparsegpt:2:4,wanda:row,wanda:2:4"
SEQUENTIAL: dict[str, bool | str | None] = {"default": None, "blocks": True, "layers": "layers"}
PEER_PATTERN = {"unstructured": "unstructured", "row": "unstructured", "2:4": "2:4"}


class Scores:
    """Perplexity on every domain; `score` records each model's and gives the worst."""

    def __init__(self, tests: dict[str, list[Tensor]]) -> None:
        self.tests = tests
        self.last: dict[str, float] = {}

    def score(self, model: nn.Module) -> float:
        self.last = {name: perplexity(model, parts) for name, parts in self.tests.items()}
        return max(self.last.values())


def subject(args: argparse.Namespace, tmp: str, scores: Scores) -> vs.Subject:
    """SmolLM2 with the domains' calibration batches, scored by `scores`."""
    model, tokenizer = llm_structure.load()
    folder = os.path.join(tmp, "smollm2")
    vs._write_folder(model, tokenizer, folder)
    found = domains(args.names, args.texts)
    chars = 6 * 512 * args.windows
    scores.tests = {
        d.name: spread(token_ids(tokenizer, d.text("evaluation", chars)), args.windows, 512)
        for d in found
    }
    windows = calibration_windows(tokenizer, found, args.calibrate, args.calibration, args.length)
    batches = [{"input_ids": w[None].clone()} for w in windows]
    include = [
        f"{name}.weight"
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and ".layers." in f".{name}"
    ]
    about = f"perplexity over {args.windows} x 512 tokens of each domain"
    return vs.Subject(
        "SmolLM2-135M-Instruct", model, folder, "causal", batches, include, scores.score,
        "ppl", False, about,
    )  # fmt: skip


def run_case(
    args: argparse.Namespace, tmp: str, item: vs.Subject, scores: Scores, case: str, index: int
) -> tuple[dict[str, float], dict[str, float], float, float] | str:
    """prunekit's and llm-compressor's perplexities per domain, and their times (the order
    of the two sides alternates from case to case); the peer's error if it failed."""
    method, pattern = case.split(":", 1)
    ours: dict[str, float] = {}
    theirs: dict[str, float] = {}
    times = [0.0, 0.0]
    for side in ("prunekit", "peer") if index % 2 == 0 else ("peer", "prunekit"):
        if side == "prunekit":
            run = vs.run_prunekit(
                item, method, pattern, tmp, SEQUENTIAL[args.sequential], args.threads
            )
            if isinstance(run, str):
                return f"prunekit's worker failed:\n{run}"
            ours, times[0] = scores.last, run.seconds
        else:
            found = _peer(args, tmp, item, scores, method, pattern)
            if isinstance(found, str):
                return found
            theirs, times[1] = found
    return ours, theirs, times[0], times[1]


def _peer(
    args: argparse.Namespace, tmp: str, item: vs.Subject, scores: Scores, method: str, pattern: str
) -> tuple[dict[str, float], float] | str:
    """llm-compressor's perplexities and time, from --peer-cache when it holds this case
    (the same calibration and domains), else run and added to it."""
    key = f"{method}:{pattern} {args.calibrate} {args.calibration}x{args.length} {args.windows}"
    cache: dict[str, list[object]] = {}
    if args.peer_cache and os.path.exists(args.peer_cache):
        with open(args.peer_cache) as f:
            cache = json.load(f)
    if key in cache and set(scores.tests) <= set(cache[key][0]):  # type: ignore[arg-type]
        held, seconds = cache[key]
        return {n: held[n] for n in scores.tests}, seconds  # type: ignore[index]
    found = vs.run_peer(args.peer, item, method, PEER_PATTERN[pattern], tmp, args.threads)
    if isinstance(found, str):
        return found
    if args.peer_cache:
        cache[key] = [scores.last, found.seconds]
        with open(args.peer_cache, "w") as f:
            json.dump(cache, f, indent=1)
    return scores.last, found.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", default=str(vs.DEFAULT_PEER), help="llm-compressor's python")
    parser.add_argument("--cases", default=CASES, help="comma-separated method:pattern")
    parser.add_argument("--domains", default=",".join(NAMES))
    parser.add_argument("--texts", default=None, help="folder of the text packages")
    parser.add_argument("--calibrate", default="mixture", help="'mixture' or a domain")
    parser.add_argument("--calibration", type=int, default=16, help="calibration windows")
    parser.add_argument("--length", type=int, default=128, help="tokens per window")
    parser.add_argument("--windows", type=int, default=4, help="evaluation windows per domain")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--sequential",
        choices=tuple(SEQUENTIAL),
        default="default",
        help="prunekit's sequential: its method's default, True ('blocks') or 'layers'",
    )
    parser.add_argument(
        "--peer-cache",
        default="",
        help="a JSON file of llm-compressor's results, read where it holds a case, else written",
    )
    args = parser.parse_args()
    args.names = tuple(args.domains.split(","))
    if args.calibrate not in ("mixture", *args.names):
        sys.exit(f"--calibrate: 'mixture' or one of {args.names}")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    print(f"prunekit beside {vs.check_peer(args.peer)}; torch {torch.__version__} here")
    scores = Scores({})
    with tempfile.TemporaryDirectory(prefix="domains-llmc-") as tmp:
        item = subject(args, tmp, scores)
        table(args, tmp, item, scores)
    print(f"\ntotal time {time.perf_counter() - started:.0f} s")


def table(args: argparse.Namespace, tmp: str, item: vs.Subject, scores: Scores) -> None:
    dense = {n: perplexity(item.model, parts) for n, parts in scores.tests.items()}
    names = list(dense)
    print(
        f"\n{item.name}: {len(item.include)} Linear weights at 50 %, calibration "
        f"{args.calibrate}, {len(item.batches)} x {args.length} tokens (the same on both "
        f"sides), {item.about}; prunekit / llm-compressor perplexity"
    )
    header = f"{'case':<24}" + "".join(f"{n:>10}" for n in names) + f"{'worst':>19}"
    print(header + "\n" + "-" * len(header))
    print(f"{'dense (perplexity)':<24}" + "".join(f"{dense[n]:>10.2f}" for n in names))
    worst: tuple[float, str] = (0.0, "")
    for index, case in enumerate(args.cases.split(",")):
        found = run_case(args, tmp, item, scores, case, index)
        if isinstance(found, str):
            print(f"{case:<24} llm-compressor failed:\n  " + found.strip().replace("\n", "\n  "))
            continue
        ours, theirs, ours_s, theirs_s = found
        ratios = {n: ours[n] / theirs[n] for n in names}
        top = max(names, key=lambda n: ratios[n])
        worst = max(worst, (ratios[top], f"{case} on {top}"))
        cells = "".join(f"{ratios[n]:>9.3f}x" for n in names)
        print(f"{case:<24}{cells}{ratios[top]:>9.3f}x {top:<9}", flush=True)
        detail = " ".join(f"{n} {ours[n]:.2f}/{theirs[n]:.2f}" for n in names)
        print(f"{'':<4}prunekit/llmc ppl: {detail}; {ours_s:.0f} s / {theirs_s:.0f} s")
    print(f"worst of all: {worst[0]:.3f}x ({worst[1]})")


if __name__ == "__main__":
    main()
