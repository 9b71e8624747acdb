"""Peak memory of reloading a compacted LLaMA: ``load_compacted(folder)`` alone against the
model built first (``load_compacted(model, folder)``) and the dense ``from_pretrained``.

    python benchmarks/reload.py            # ~45M-parameter LLaMA (hidden 512, 8 layers)
    python benchmarks/reload.py --quick    # ~6M parameters

A random LLaMA (no download) has a quarter of its heads cut alone (the hidden width kept: the
case from_pretrained cannot rebuild) and half of its MLP channels, is compacted and saved
with save_compacted; the dense model is saved with save_pretrained beside it. Each reload
runs in a fresh subprocess, single-threaded, after its imports (transformers' LLaMA
code, safetensors, prunekit's loaders): the peak resident set is
reset (/proc/self/clear_refs), and the reload's peak is its high-water mark above the
resident set at that point, once loaded and again after one forward (from_pretrained maps
the weights file and reads its pages only when the forward touches them). The reloaded
models' logits are compared with the compacted model's, bit for bit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

MIB = 1 << 20

CHILD = r"""
import sys, torch, transformers, prunekit, safetensors.torch
import transformers.models.llama.modeling_llama  # imported before the measure, not in it
import prunekit.structure.saving.hfbuild
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
transformers.LlamaForCausalLM, transformers.AutoModelForCausalLM, transformers.AutoConfig
mode, folder, config_folder = sys.argv[1], sys.argv[2], sys.argv[3]
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
open("/proc/self/clear_refs", "w").write("5")  # the peak resident set starts again here
base = status("VmRSS:")
if mode == "folder":
    model = prunekit.load_compacted(folder)
elif mode == "into-fresh":
    config = transformers.AutoConfig.from_pretrained(config_folder)
    model = prunekit.load_compacted(transformers.LlamaForCausalLM(config), folder).eval()
else:
    model = transformers.AutoModelForCausalLM.from_pretrained(config_folder)
loaded = status("VmHWM:") - base
ids, reference = torch.load(folder + "/../reference.pt")
with torch.no_grad():
    logits = model(ids).logits
peak = status("VmHWM:") - base
same = mode == "dense" or torch.equal(logits, reference)
print(loaded, peak, int(same))
"""


def build(quick: bool, root: Path) -> tuple[int, int]:
    """Save the dense model and the compacted one; return their sizes in bytes."""
    import transformers

    import prunekit

    transformers.logging.set_verbosity_error()
    size = (128, 4, 4, 384, 8000) if quick else (512, 8, 8, 1536, 16000)
    hidden, layers, heads, inner, vocab = size
    config = transformers.LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, intermediate_size=inner, vocab_size=vocab,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    dense = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    model.save_pretrained(root / "dense")
    ids = torch.randint(0, vocab, (1, 16), generator=torch.Generator().manual_seed(0))
    prunekit.prune_channels(model, {"input_ids": ids}, 0.5, heads=0.25)
    report = prunekit.compact(model, {"input_ids": ids}, latency_runs=0)
    assert report.not_rebuilt, "expected a model from_pretrained cannot rebuild"
    prunekit.save_compacted(model, root / "compacted")
    with torch.no_grad():
        torch.save((ids, model(ids).logits), root / "reference.pt")
    compacted = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return dense, compacted


def measure(mode: str, root: Path) -> tuple[int, int, bool]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(root / "compacted"), str(root / "dense")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{proc.stderr}")
    loaded, peak, same = proc.stdout.split()[-3:]
    return int(loaded), int(peak), same == "1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~6M-parameter model")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        dense, compacted = build(args.quick, root)
        print(f"dense weights     {dense / MIB:8.1f} MiB")
        print(f"compacted weights {compacted / MIB:8.1f} MiB ({compacted / dense:.0%} of dense)")
        print(f"{'peak RSS above the start (MiB, x compacted)':<46} {'loading':>15} "
              f"{'+ a forward':>15}  logits equal")  # fmt: skip
        rows = [
            ("folder", "load_compacted(folder)"),
            ("into-fresh", "load_compacted(LlamaForCausalLM(config), folder)"),
            ("dense", "from_pretrained(dense folder) (peer, dense)"),
        ]
        for mode, label in rows:
            loaded, peak, same = measure(mode, root)
            equal = "n/a" if mode == "dense" else ("yes" if same else "NO")
            cells = [f"{n / MIB:6.1f} ({n / compacted:4.2f}x)" for n in (loaded, peak)]
            print(f"{label:<46} {cells[0]:>15} {cells[1]:>15}  {equal}")


if __name__ == "__main__":
    main()
