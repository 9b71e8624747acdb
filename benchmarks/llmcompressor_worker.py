"""One llm-compressor one-shot run, for benchmarks/vs_llmcompressor.py (which starts it).

Runs in llm-compressor's own venv (see vs_llmcompressor.py: it pins an older transformers
than prunekit's venv), so it imports nothing of prunekit. It loads the model from a
safetensors folder, calibrates on the batches saved by the caller, prunes with
llm-compressor's ``oneshot`` and the sequential pipeline, and writes the pruned Linear
weights and its measurements (seconds and peak resident-set growth of the ``oneshot`` call
alone) for the caller to score.

    python llmcompressor_worker.py MODEL_DIR BATCHES.pt OUT.pt --kind causal \\
        --method sparsegpt --pattern 2:4 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import time
from typing import Any

MIB = 1 << 20


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    """Free pages back to the OS (as calibrated.trim does), then the peak reset to now."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def modifier(method: str, pattern: str, ignore: list[str]) -> Any:
    """The llm-compressor modifier for `method` at 50 %: 'unstructured' is its default
    mask structure ('0:0': Wanda per output row, SparseGPT per block of columns)."""
    structure = "0:0" if pattern == "unstructured" else pattern
    if method == "wanda":
        from llmcompressor.modifiers.pruning import WandaPruningModifier

        return WandaPruningModifier(sparsity=0.5, mask_structure=structure, ignore=ignore)
    from llmcompressor.modifiers.pruning import SparseGPTModifier

    return SparseGPTModifier(
        sparsity=0.5,
        mask_structure=structure,
        ignore=ignore,
        block_size=128,
        dampening_frac=0.01,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("batches")
    parser.add_argument("out")
    parser.add_argument("--kind", choices=("causal", "encoder"), required=True)
    parser.add_argument("--method", choices=("wanda", "sparsegpt"), required=True)
    parser.add_argument("--pattern", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(args.threads)
    from llmcompressor import oneshot
    from transformers import AutoModel, AutoModelForCausalLM

    load = AutoModelForCausalLM if args.kind == "causal" else AutoModel
    model = load.from_pretrained(args.model, dtype=torch.float32).eval()
    # the weights into the process's own memory, not left mapped from the file (paged in
    # during the call, its peak would count the model): as prunekit_worker.py does
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone()
    batches: list[dict[str, torch.Tensor]] = torch.load(args.batches)
    # the same layers as prunekit's side: every Linear of the blocks, not the head/pooler
    ignore = ["re:.*lm_head"] if args.kind == "causal" else ["re:.*pooler.*"]
    recipe = modifier(args.method, args.pattern, ignore)
    loader = DataLoader(batches, batch_size=None, shuffle=False)

    _reset_peak()
    before = _status("VmRSS")
    start = time.perf_counter()
    oneshot(model=model, dataset=loader, recipe=recipe, pipeline="sequential")
    seconds = time.perf_counter() - start
    peak = max(0, _status("VmHWM") - before) / MIB

    weights = {
        name: module.weight.detach().clone()
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    torch.save(weights, args.out)
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump({"seconds": seconds, "mib": peak}, f)


if __name__ == "__main__":
    main()
