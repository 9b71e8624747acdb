"""One prunekit one-shot run in a fresh process, for benchmarks/vs_llmcompressor.py (which
starts it, as it starts llmcompressor_worker.py for llm-compressor): both sides load the
model from the same safetensors folder in a process of their own, calibrate on the same
saved batches, and measure their pruning call alone the same way (wall time; growth of the
process's peak resident set, VmHWM, above its resident set just before the call, the
allocator's free pages given back to the OS first and the peak reset).

    python prunekit_worker.py MODEL_DIR BATCHES.pt INCLUDE.json OUT.pt --kind causal \\
        --method sparsegpt --pattern 2:4 --threads 1 [--sequential layers]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import calibrated


def load(folder: str, kind: str) -> torch.nn.Module:
    """The model of `folder` in float32, evaluation mode."""
    for name in ("nms", "qnms"):  # transformers imports torchvision (see llm_structure.load)
        with contextlib.suppress(RuntimeError):
            schema = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            torch.library.define(f"torchvision::{name}", schema)
    from transformers import AutoModel, AutoModelForCausalLM

    loader = AutoModelForCausalLM if kind == "causal" else AutoModel
    model: torch.nn.Module = loader.from_pretrained(folder, dtype=torch.float32)
    in_memory(model)
    return model.eval()


def in_memory(model: torch.nn.Module) -> None:
    """Every parameter and buffer copied into the process's own memory: from_pretrained
    leaves the weights mapped from the safetensors file, paged in when first read, so a
    call's peak would count the model itself (benchmarks/llmcompressor_worker.py does the
    same)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone()


def _sequential(value: str | None) -> dict[str, object]:
    if value is None:
        return {}
    return {"sequential": value if value == "layers" else value == "true"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("batches")
    parser.add_argument("include")
    parser.add_argument("out")
    parser.add_argument("--kind", choices=("causal", "encoder"), required=True)
    parser.add_argument("--method", choices=("wanda", "sparsegpt"), required=True)
    parser.add_argument("--pattern", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sequential", choices=("layers", "true", "false"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import prunekit

    model = load(args.model, args.kind)
    batches: list[dict[str, torch.Tensor]] = torch.load(args.batches)
    with open(args.include) as f:
        include: list[str] = json.load(f)
    ours = "row" if args.method == "wanda" and args.pattern == "unstructured" else args.pattern

    def prune() -> None:
        prunekit.prune_model(
            model,
            0.5,
            method=args.method,
            pattern=ours,
            calibration=batches,
            include=include,
            progress=False,
            keep_masks=False,  # a plain pruned model, as llm-compressor's oneshot leaves
            **_sequential(args.sequential),  # type: ignore[arg-type]
        )

    seconds, mib = calibrated.measure(prune)
    wanted = {name.removesuffix(".weight") for name in include}
    weights = {
        name: module.weight.detach().clone()
        for name, module in model.named_modules()
        if name in wanted
    }
    torch.save(weights, args.out)
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump({"seconds": seconds, "mib": mib}, f)


if __name__ == "__main__":
    main()
