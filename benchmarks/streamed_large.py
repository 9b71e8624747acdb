"""Wanda 50 % on a synthetic Llama larger than this machine's memory, one block at a time.

    python benchmarks/streamed_large.py            # 54 blocks of a 13B-wide Llama: 30.4 GB bf16
    python benchmarks/streamed_large.py --layers 2 # the same width, 2 blocks (a quick look)
    python benchmarks/streamed_large.py --keep     # leave the two folders in --root

1. A LlamaForCausalLM folder (hidden 5120, MLP 13824, 40 heads over 8 key-value heads,
   vocabulary 32000) is written as ~5 GB bf16 safetensors shards with
   model.safetensors.index.json and config.json, tensor by tensor in chunks (never the
   model, never a shard in memory). Weights are seeded normal * 0.02; the two matrices that
   write into the residual stream (o_proj, down_proj) * 0.02 / sqrt(2 x blocks), so the
   residual stays of order one through every block (no overflow in bf16); norms are 1.
   (Each chunk of 2**24 entries is a slice of 2**26 seeded normals from a seeded random
   offset: drawing 15 billion normals takes longer than the pruning on this machine.)
2. A fresh process (`nice -n 10`) calls ``prune_streamed(folder, out, "wanda", 0.5,
   calibration=...)`` on 4 x 128 token ids (the bytes of pydoc's topics, stdlib text, each
   byte a token): its wall time and its peak resident set (VmHWM, its own since exec).
3. Two more fresh processes, in which ``import prunekit`` fails, read the dense and the
   pruned folder with transformers and safetensors only: the config, the index against every
   shard's header (names, shapes, dtypes), the model built from the config on the meta
   device, then a block-streamed forward (one block's weights in memory at a time, computed
   in float32) for the perplexity of 2 x 128 other tokens, and greedy tokens after an
   8-token prompt (each a full pass over the blocks: the pruned folder generates
   --generate tokens, the dense one its first only). The pruned process also counts the
   zeros of the block matrices it loads.

Random weights make a useless language model (a perplexity near the vocabulary's size): the
two perplexities are a check that the pruned folder runs and stays close to the dense one,
not a measure of quality. Both folders live under --root (not /tmp) and are deleted at the
end, also on failure, unless --keep; the run refuses to start without room for both.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

GB = 10**9
GIB = 1 << 30
INDEX = "model.safetensors.index.json"
SHARD = 5 * GB
HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 5120, 13824, 40, 8, 32000
BLOCKS = 54  # the fewest blocks of this width over 30e9 bytes in bf16
ROOT = Path("/work/scratch-big")
CHUNK = 1 << 24  # entries written at a time
POOL = 1 << 26  # seeded normal numbers the weights are drawn from
CALIBRATION = (4, 128)  # windows x tokens: 512 calibration tokens
EVALUATION = (2, 128)
PROMPT = 8
# Run first in the processes that read the folders: prunekit cannot be imported there.
NO_PRUNEKIT = "import sys\nsys.modules['prunekit'] = None\n"


def llama_config(layers: int, **shape: int) -> Any:
    """The synthetic model's LlamaConfig (`shape` overrides the width, for small runs)."""
    from transformers import LlamaConfig

    sizes = {"hidden_size": HIDDEN, "intermediate_size": FFN, "num_attention_heads": HEADS}
    sizes |= {"num_key_value_heads": KV_HEADS, "vocab_size": VOCAB} | shape
    return LlamaConfig(
        num_hidden_layers=layers,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        dtype="bfloat16",
        **sizes,
    )


def layout(config: Any) -> list[tuple[str, tuple[int, ...], float]]:
    """Every tensor of the model: name, shape and the standard deviation of its entries
    (0: a norm, all ones), in the order save_pretrained writes them."""
    d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    kv = config.num_key_value_heads * (d // config.num_attention_heads)
    std, out = 0.02, 0.02 / math.sqrt(2 * config.num_hidden_layers)
    found: list[tuple[str, tuple[int, ...], float]] = [("model.embed_tokens.weight", (v, d), std)]
    for i in range(config.num_hidden_layers):
        at = f"model.layers.{i}."
        found += [(f"{at}input_layernorm.weight", (d,), 0.0)]
        found += [(f"{at}self_attn.q_proj.weight", (d, d), std)]
        found += [(f"{at}self_attn.{p}_proj.weight", (kv, d), std) for p in "kv"]
        found += [(f"{at}self_attn.o_proj.weight", (d, d), out)]
        found += [(f"{at}post_attention_layernorm.weight", (d,), 0.0)]
        found += [(f"{at}mlp.{p}_proj.weight", (f, d), std) for p in ("gate", "up")]
        found += [(f"{at}mlp.down_proj.weight", (d, f), out)]
    return [*found, ("model.norm.weight", (d,), 0.0), ("lm_head.weight", (v, d), std)]


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def model_bytes(config: Any) -> int:
    return sum(2 * _numel(shape) for _, shape, _ in layout(config))


def write_folder(folder: Path, config: Any, seed: int = 0, shard: int = SHARD) -> int:
    """Write the model of `config` into `folder` as bf16 shards of at most `shard` bytes
    (a tensor never split), tensor by tensor in chunks of CHUNK entries; the bytes written."""
    from prunekit.io.mapped import Planned, Writer

    files: list[list[Planned]] = [[]]
    used = 0
    stds = {}
    for name, shape, std in layout(config):
        if used and used + 2 * _numel(shape) > shard:
            files.append([])
            used = 0
        files[-1].append(Planned(name, "BF16", shape))
        used += 2 * _numel(shape)
        stds[name] = std
    named = {f"model-{i + 1:05d}-of-{len(files):05d}.safetensors": p for i, p in enumerate(files)}
    folder.mkdir(parents=True)
    writer = Writer(folder, named, {file: {"format": "pt"} for file in named})
    try:
        generator = torch.Generator().manual_seed(seed)
        pool = torch.randn(
            min(POOL, max(_numel(s) for _, s, _ in layout(config))), generator=generator
        )
        for plans in named.values():
            for plan in plans:
                _fill(writer, plan.name, _numel(plan.shape), stds[plan.name], pool, generator)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    weight_map = {p.name: file for file, plans in named.items() for p in plans}
    total = sum(writer.sizes.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX).write_text(json.dumps(index, indent=2))
    config.save_pretrained(folder)
    return total


def _fill(
    writer: Any, name: str, n: int, std: float, pool: Tensor, generator: torch.Generator
) -> None:
    """Tensor `name`'s entries, CHUNK at a time: each chunk the pool's entries from a seeded
    random offset on (drawing every entry anew takes longer than the pruning here), times
    `std`; all ones where `std` is 0."""
    for start in range(0, n, CHUNK):
        count = min(CHUNK, n - start)
        if std:
            at = int(torch.randint(0, pool.numel() - count + 1, (1,), generator=generator))
            part = pool[at : at + count].mul(std).to(torch.bfloat16)
        else:
            part = torch.ones(count, dtype=torch.bfloat16)
        writer.write(name, start, part)


def token_ids(vocab: int) -> tuple[Tensor, Tensor, Tensor]:
    """Calibration windows (first half of pydoc's topics), evaluation windows and a prompt
    (second half): each byte of the UTF-8 text is a token id (byte + 3, below `vocab`)."""
    from pydoc_data.topics import topics

    data = "\n".join(topics[k] for k in sorted(topics)).encode()
    ids = torch.tensor(list(data), dtype=torch.long).add_(3).remainder_(vocab)
    half = ids.numel() // 2
    n, t = CALIBRATION
    m, u = EVALUATION
    calibration = ids[: n * t].view(n, t)
    evaluation = ids[half : half + m * u].view(m, u)
    prompt = ids[half + m * u : half + m * u + PROMPT].view(1, PROMPT)
    return calibration, evaluation, prompt


def peak_bytes() -> int:
    """This process's peak resident set since its exec (VmHWM), in bytes."""
    with open("/proc/self/status") as stream:
        for line in stream:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def resident_bytes() -> int:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- the pruning, in its own process ---------------------------------------------------------


def prune_child(folder: Path, out: Path, ids: Path) -> dict[str, Any]:
    """Prune `folder` into `out` with Wanda 50 % on the calibration windows of `ids`."""
    from prunekit.io.streamed import prune_streamed

    batches = [{"input_ids": w[None]} for w in torch.load(ids)["calibration"]]
    base = resident_bytes()
    start = time.perf_counter()
    done = prune_streamed(folder, out, "wanda", 0.5, calibration=batches, progress=True)
    seconds = time.perf_counter() - start
    found = {"seconds": seconds, "peak": peak_bytes(), "base": base, "blocks": done.blocks}
    return found | {"zeros": done.zeros, "numel": done.numel}


# -- the block-streamed forward, with nothing but transformers and safetensors ----------------


class _Stop(Exception):
    """Raised by the hook that captures the first block's arguments."""


class StreamedModel:
    """A causal LM of a Hugging Face folder whose forward holds one block's weights at a
    time (read from the shards when the block runs, dropped after), computing in float32.
    The model itself is built from the config on the meta device."""

    def __init__(self, folder: Path) -> None:
        import accelerate
        from transformers import AutoConfig, AutoModelForCausalLM

        self.folder = folder
        self.config = AutoConfig.from_pretrained(folder)
        with accelerate.init_empty_weights(include_buffers=False):
            self.model = AutoModelForCausalLM.from_config(
                self.config, dtype=torch.float32, attn_implementation="sdpa"
            )
        self.model.eval()
        self.weight_map: dict[str, str] = json.loads((folder / INDEX).read_text())["weight_map"]
        self.zeros = self.numel = 0  # of the blocks' matrices loaded so far

    def _load(self, prefix: str, module: nn.Module, count: bool = False) -> None:
        from safetensors import safe_open

        for name, _ in list(module.named_parameters()):
            full = prefix + name
            with safe_open(self.folder / self.weight_map[full], "pt") as opened:
                stored = opened.get_tensor(full)
            if count and stored.dim() == 2:
                self.zeros += int((stored == 0).sum())
                self.numel += stored.numel()
            path, _, leaf = name.rpartition(".")
            owner = module.get_submodule(path)
            owner._parameters[leaf] = nn.Parameter(stored.float(), requires_grad=False)

    @staticmethod
    def _drop(module: nn.Module) -> None:
        for owner in module.modules():
            for leaf, param in list(owner._parameters.items()):
                if param is not None:
                    owner._parameters[leaf] = nn.Parameter(param.to("meta"), False)

    def _capture(self, ids: Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """What the first block is called with on `ids` (embeddings, mask, positions)."""
        captured: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

        def hook(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            captured.append((args, kwargs))
            raise _Stop

        handle = self.model.model.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
        try:
            self.model.model(input_ids=ids, use_cache=False)
        except _Stop:
            pass
        finally:
            handle.remove()
        return captured[0]

    @torch.no_grad()
    def logits(self, batches: Sequence[Tensor], count: bool = False) -> list[Tensor]:
        """The logits of each batch of token ids, in one pass over the blocks."""
        base = self.model.model
        self._load("model.embed_tokens.", base.embed_tokens)
        inputs = [self._capture(ids) for ids in batches]
        self._drop(base.embed_tokens)
        for i, block in enumerate(base.layers):
            self._load(f"model.layers.{i}.", block, count)
            inputs = [_step(block, args, kwargs) for args, kwargs in inputs]
            self._drop(block)
        self._load("model.norm.", base.norm)
        self._load("lm_head.", self.model.lm_head)
        out = [self.model.lm_head(base.norm(args[0])) for args, _ in inputs]
        self._drop(base.norm)
        self._drop(self.model.lm_head)
        return out


def _step(
    block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    out = block(*args, **kwargs)
    hidden = out[0] if isinstance(out, tuple) else out
    return (hidden, *args[1:]), kwargs


def perplexity(logits: Tensor, ids: Tensor) -> float:
    loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    return math.exp(float(loss))


def check_folder(folder: Path) -> dict[str, Any]:
    """The folder as transformers and safetensors read it: the config, every index entry
    in its shard's header with the shape and dtype of the model built from the config on
    the meta device."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
    dtypes, shapes = set(), {}
    for file in sorted(set(weight_map.values())):
        with safe_open(folder / file, "pt") as opened:
            for name in opened.keys():  # noqa: SIM118 (a safe_open is not a mapping)
                part = opened.get_slice(name)
                dtypes.add(part.get_dtype())
                shapes[name] = tuple(part.get_shape())
    expected = {n: tuple(p.shape) for n, p in model.named_parameters()}
    return {
        "model_type": config.model_type,
        "matches": expected == shapes and set(weight_map) == set(shapes),
        "dtypes": sorted(dtypes),
        "shards": len(set(weight_map.values())),
    }


def eval_child(folder: Path, ids: Path, generate: int, count: bool) -> dict[str, Any]:
    """In a process where prunekit cannot be imported: check the folder, then the
    perplexity of the evaluation windows and `generate` greedy tokens after the prompt."""
    try:
        import prunekit  # noqa: F401
    except ImportError:
        blocked = True
    else:
        blocked = False
    found: dict[str, Any] = {"prunekit_blocked": blocked, **check_folder(folder)}
    tokens = torch.load(ids)
    evaluation, prompt = tokens["evaluation"], tokens["prompt"]
    model = StreamedModel(folder)
    start = time.perf_counter()
    logits = model.logits([evaluation, prompt], count)
    found["ppl"] = perplexity(logits[0], evaluation)
    found["pass_seconds"] = time.perf_counter() - start
    generated = [int(logits[1][0, -1].argmax())]
    saved = model.zeros, model.numel  # the later passes count nothing
    for _ in range(generate - 1):
        ids_now = torch.cat([prompt, torch.tensor([generated])], dim=1)
        generated.append(int(model.logits([ids_now])[0][0, -1].argmax()))
    found |= {"generated": generated, "zeros": saved[0], "numel": saved[1]}
    found["seconds"] = time.perf_counter() - start
    found["peak"] = peak_bytes()
    return found


# -- the parent ------------------------------------------------------------------------------


def spawn(argv: list[str], prelude: str = "", nice: int = 0, log: Path | None = None) -> Any:
    """Start this file with `argv` in a fresh Python process (stderr to `log`)."""
    code = prelude + f"import sys\nsys.argv = {[__file__, *argv]!r}\n"
    code += f"path = {__file__!r}\n"
    code += "where = {'__name__': '__main__', '__file__': path}\n"
    code += "exec(compile(open(path).read(), path, 'exec'), where)\n"
    command = [sys.executable, "-c", code]
    if nice:
        command = ["nice", "-n", str(nice), *command]
    errors = open(log or os.devnull, "w")  # noqa: SIM115 (closed by finish)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
    process.errors = errors  # type: ignore[attr-defined]
    process.log = log  # type: ignore[attr-defined]
    return process


def finish(process: Any) -> Any:
    """The last stdout line (JSON) of a process `spawn` began, once it ends."""
    out, _ = process.communicate()
    process.errors.close()
    if process.returncode:
        tail = process.log.read_text()[-3000:] if process.log else ""
        raise SystemExit(f"{process.args[-1][:200]} failed ({process.returncode}):\n{tail}")
    return json.loads(out.strip().splitlines()[-1])


def room(root: Path, need: int) -> None:
    """Refuse to start unless `root`'s file system has `need` bytes free (and 2 GB more)."""
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if free < need + 2 * GB:
        raise SystemExit(
            f"{root}: {free / GB:.1f} GB free; the dense and the pruned folder need "
            f"{need / GB:.1f} GB (and 2 GB to spare). Free some space or pass --root elsewhere."
        )


def formula(config: Any, base: int) -> dict[str, float]:
    """The guide's peak-memory formula for this shape (GiB): the process before the call,
    the embedding rows the calibration reads (bf16, mapped), the hidden states into and out
    of one block, one block three times over (weights, mask, masked weights), Wanda's norms;
    b = 4, a bf16 folder's blocks being computed in float32."""
    d, layers, b = config.hidden_size, config.num_hidden_layers, 4
    block = (model_bytes(config) - 2 * 2 * config.vocab_size * d - 2 * d) // 2 // layers
    n, t = CALIBRATION
    rows = 256 * d * 2  # at most 256 distinct byte tokens
    terms = {"R0": base, "E": rows, "hidden": 2 * n * t * d * b, "3Pb": 3 * block * b}
    terms["H"] = 8 * max(d, config.intermediate_size)
    return {k: v / GIB for k, v in terms.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=BLOCKS)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--generate", type=int, default=2)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--small", action="store_true", help="a narrow model (hidden 256)")
    parser.add_argument("--child", choices=("prune", "eval"))
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--ids", type=Path)
    parser.add_argument("--count", action="store_true")
    args = parser.parse_args()
    if args.child == "prune":
        print(json.dumps(prune_child(args.folder, args.out, args.ids)))
        return
    if args.child == "eval":
        print(json.dumps(eval_child(args.folder, args.ids, args.generate, args.count)))
        return
    small = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4}
    small |= {"num_key_value_heads": 2}
    config = llama_config(args.layers, **(small if args.small else {}))
    size = model_bytes(config)
    room(args.root, 2 * size)
    work = args.root / f"llama-{config.hidden_size}-{args.layers}"
    if work.exists():
        raise SystemExit(f"{work} exists: remove it (a run left it with --keep or was killed)")
    try:
        run(work, config, args)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run(work: Path, config: Any, args: argparse.Namespace) -> None:
    began = time.perf_counter()
    dense, pruned, ids = work / "dense", work / "pruned", work / "ids.pt"
    start = time.perf_counter()
    size = write_folder(dense, config)
    written = time.perf_counter() - start
    calibration, evaluation, prompt = token_ids(config.vocab_size)
    torch.save({"calibration": calibration, "evaluation": evaluation, "prompt": prompt}, ids)
    # one process at a time: the machine is shared, and its memory with it
    argv = ["--child", "prune", "--folder", str(dense), "--out", str(pruned), "--ids", str(ids)]
    got = finish(spawn(argv, nice=10, log=work / "prune.log"))
    argv = ["--child", "eval", "--folder", str(dense), "--ids", str(ids), "--generate", "1"]
    evals = {"dense": finish(spawn(argv, NO_PRUNEKIT, nice=10, log=work / "dense.log"))}
    argv = ["--child", "eval", "--folder", str(pruned), "--ids", str(ids), "--count"]
    argv += ["--generate", str(args.generate)]
    evals["pruned"] = finish(spawn(argv, NO_PRUNEKIT, nice=10, log=work / "pruned.log"))
    report(config, size, written, got, evals, time.perf_counter() - began)


def report(
    config: Any,
    size: int,
    written: float,
    got: dict[str, Any],
    evals: dict[str, dict[str, Any]],
    total: float,
) -> None:
    params = size // 2
    d, p = evals["dense"], evals["pruned"]
    n, t = CALIBRATION
    m, u = EVALUATION
    terms = formula(config, got["base"])
    loads = all(e["prunekit_blocked"] and e["matches"] for e in evals.values())
    lines = [
        f"model: LlamaForCausalLM, {config.num_hidden_layers} blocks, hidden "
        f"{config.hidden_size}, MLP {config.intermediate_size}, {config.num_attention_heads} "
        f"heads / {config.num_key_value_heads} KV, vocab {config.vocab_size}",
        f"size: {size / GB:.2f} GB bf16, {params / 1e9:.2f} B parameters, {p['shards']} shards"
        f" (written in {written:.0f} s); machine memory "
        f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / GIB:.1f} GiB",
        f"calibration: {n} x {t} = {n * t} tokens; Wanda, amount 0.5, per row",
        f"prune wall time: {got['seconds']:.0f} s (nice -n 10, torch threads "
        f"{torch.get_num_threads()})",
        f"peak RSS: {got['peak'] / GIB:.2f} GiB (before the call {got['base'] / GIB:.2f} GiB)",
        "formula: "
        + " + ".join(f"{k} {v:.2f}" for k, v in terms.items())
        + f" = {sum(terms.values()):.2f} GiB",
        f"zeros: {p['zeros']:,} of {p['numel']:,} block matrix entries "
        f"({p['zeros'] / max(p['numel'], 1):.4f}); output dtypes {', '.join(p['dtypes'])}",
        f"perplexity ({m} x {u} tokens, block-streamed, float32): dense {d['ppl']:.1f}, "
        f"pruned {p['ppl']:.1f} ({p['ppl'] / d['ppl']:.3f}x)",
        f"greedy tokens after an {PROMPT}-token prompt: pruned {p['generated']}, dense first "
        f"{d['generated'][:1]}; one pass over the blocks {p['pass_seconds']:.0f} s",
        f"loads without prunekit: {'yes' if loads else 'no'}",
        f"whole benchmark: {total:.0f} s",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
