"""Calibrated pruning (Wanda, SparseGPT) of a sharded Hugging Face folder, one decoder block
in memory at a time.

The model is built from the folder's config with its parameters on the meta device (no
memory); its embeddings are mapped from the shards (pages read as tokens touch them). The
calibration batches run up to the first block once; their hidden states are kept. Then each
block in turn is mapped from the shards, calibrated on the hidden states, pruned by the
in-memory engine's own step (whole.oneshot_execute.prune_block: the same statistics, criteria and
order, so the same masks and SparseGPT updates), run to give the next block's hidden states,
written to the output shards and let go. Every other tensor is copied as it is stored.

Memory (bytes), with b bytes per weight as computed (4 for a bfloat16 or float16 folder:
see COMPUTE), d the hidden size, S x T calibration tokens:
about ``S*T*d*b * 2`` (the hidden states, in and out of one block) + one block's weights
(each pruning made permanent in place as soon as its layer is pruned: one layer's mask and
masked product at a time) + its statistics (Wanda: a float64 per input feature;
SparseGPT: a float32 d_in x d_in Hessian of one input) + SparseGPT's work on the matrices
reading that input (float32) + the embedding rows the tokens use. The output is staged beside
its folder and swapped in whole (io.atomic.atomic_folder): a failure leaves it as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import nn

import prunekit.calibrate as cal
from prunekit._extras import require
from prunekit.calibrate.layer_matrices import calibrates
from prunekit.core.errors import type_error, value_error
from prunekit.core.example_inputs import named
from prunekit.core.heap import trim
from prunekit.io.atomic import atomic_folder
from prunekit.io.files import CheckpointError, refuse_empty_path, writable_folder
from prunekit.io.folders import copy_companions
from prunekit.io.mapped import Planned, Stored, Writer, stored_values
from prunekit.io.sharded import Checkpoint, open_checkpoint, write_index
from prunekit.patterns import Pattern
from prunekit.progress import Progress
from prunekit.whole.config import Config
from prunekit.whole.oneshot_execute import prune_block
from prunekit.whole.oneshot_plan import TensorRef, current_values, make_plan

if TYPE_CHECKING:  # Unpack is in typing from Python 3.11 on
    from typing_extensions import Unpack

__all__ = [
    "FAMILIES",
    "METHODS",
    "StreamedConfig",
    "StreamedOptions",
    "StreamedResult",
    "prune_streamed",
]

OWNER = "prune_streamed"
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
"""The config ``model_type``s streamed: decoder-only models whose blocks are
``model.layers.<i>``, each taking the previous one's hidden states."""
METHODS = ("wanda", "sparsegpt")


@dataclass(frozen=True)
class StreamedResult:
    """What a streamed pruning wrote: the index, the tensors pruned, how many entries they
    hold, how many of those are zero now, and how many blocks were streamed."""

    index: Path
    pruned: list[str]
    numel: int
    zeros: int
    blocks: int


class StreamedOptions(TypedDict, total=False):
    """The keywords of ``prune_streamed`` beside its config: the fields of ``StreamedConfig``
    other than `method` and `amount`."""

    pattern: Pattern | str | None
    sequential: bool | str | None
    damp: float | None
    blocksize: int | None
    progress: bool | None


@dataclass(frozen=True, eq=False)
class StreamedConfig:
    """Every option of ``prune_streamed`` but the folders and the calibration, checked when
    made: ``prune_streamed(path, out, calibration=batches, config=StreamedConfig(...))``
    prunes as the same keywords do; ``dataclasses.replace`` makes a changed copy, checked
    again.

    Args:
        method: 'wanda' or 'sparsegpt'.
        amount: the fraction of each matrix to prune (for 'N:M', (M-N)/M).
        pattern: 'unstructured', 'row', 'N:M' or a Pattern; None: the method's own, as
            prune_model's.
        sequential: True (block by block) or 'layers' (in each block, group by group);
            None: the method's own, as prune_model's. False (one pass of the whole model)
            cannot stream.
        damp: SparseGPT's dampening, the share of the Hessian's mean diagonal added to its
            diagonal (see ``prunekit.SparseGPT``); None: SparseGPT's own (0.1). 'sparsegpt'
            only: 'wanda' refuses it (as ``whole.Config``).
        blocksize: SparseGPT's columns pruned and updated at a time; None: SparseGPT's own
            (128). 'sparsegpt' only, as `damp`.
        progress: a bar on stderr (default: when stderr is a terminal).

    Attributes:
        whole: the same options as the in-memory engine's checked ``whole.Config``.

    Raises:
        ValueError: a method that does not stream, sequential=False, or any option
            ``whole.Config`` refuses (`damp` or `blocksize` with 'wanda').
        TypeError: an option of the wrong type.
    """

    method: str = "wanda"
    amount: float = 0.5
    pattern: Pattern | str | None = None
    sequential: bool | str | None = None
    damp: float | None = None
    blocksize: int | None = None
    progress: bool | None = None
    whole: Config = field(init=False, repr=False)

    def __post_init__(self) -> None:
        made = _config(self.method, self.amount, self.pattern, self.sequential, self.damp,
                       self.blocksize, self.progress)  # fmt: skip
        object.__setattr__(self, "whole", made)


def prune_streamed(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    method: str | None = None,
    amount: float | None = None,
    *,
    calibration: Iterable[object],
    config: StreamedConfig | None = None,
    **options: Unpack[StreamedOptions],
) -> StreamedResult:
    """Prune the weight matrices of every decoder block of the sharded Hugging Face folder
    `path` with Wanda or SparseGPT, block by block, into the folder `out`: what
    ``prune_model(model, amount, method=..., calibration=...)`` gives the whole model in
    memory (the same masks; SparseGPT's updated weights), the pruning made permanent.

    ``prune_streamed(path, out, "wanda", 0.5, calibration=batches)`` or, the same,
    ``prune_streamed(path, out, calibration=batches, config=StreamedConfig("wanda", 0.5))``.

    Args:
        path: a folder as ``save_pretrained`` writes it: config.json and safetensors shards
            with ``model.safetensors.index.json``, of a family in FAMILIES.
        out: the output folder (made if missing): the same shards and index, and every
            other file of `path` (config, tokenizer, ...).
        method: 'wanda' or 'sparsegpt' (``StreamedConfig.method``).
        amount: the fraction of each matrix to prune (``StreamedConfig.amount``).
        calibration: batches for the model's forward (tensors of token ids, or mappings
            such as ``{"input_ids": ...}``).
        config: every option at once (then neither `method`, `amount` nor a keyword).
        **options: the other fields of ``StreamedConfig`` by name: `pattern`,
            `sequential`, `damp`, `blocksize`, `progress`.

    Returns:
        The index written, the names pruned, their entries and zeros, the blocks.

    Raises:
        TypeError: an argument or batch of the wrong type, or an unknown keyword.
        ValueError: a bad argument or batch, a model family not streamed, or `config`
            beside `method`, `amount` or keywords.
        CheckpointError: a folder that cannot be read or written, or too little free disk
            for the output.

    The output is left as it was on any error.
    """
    refuse_empty_path(OWNER, "out", out)  # Path("") is ".": the current folder
    settings = streamed_config(method, amount, config, options).whole
    batches = cal.batch_list(calibration, OWNER)
    check_tokens(batches, OWNER)
    checkpoint, model, blocks, folder = open_streamed(path, out)
    check_tokens(batches, OWNER, model)  # a tuple batch's mask, by the forward's names
    source = checkpoint.index.parent
    total = sum(len(_targets(block)) for block in blocks)
    label = f"{settings.method} {settings.chosen_pattern!r} streamed"  # None: the method's own
    bar = Progress(label, total, settings.progress)
    try:
        with atomic_folder(folder) as stage:
            done = _stream(model, blocks, checkpoint, stage, settings, batches, bar)
            index = write_index(stage, checkpoint.metadata, weight_map(checkpoint), done[2])
            copy_companions(source, stage)
    finally:
        bar.close()
    return StreamedResult(folder / index.name, done[3], done[0], done[1], len(blocks))


def streamed_config(
    method: object, amount: object, config: object, options: Mapping[str, object]
) -> StreamedConfig:
    """The config of a call: `config` alone, or one made of `method`, `amount` and the
    keywords `options`."""
    unknown = [k for k in options if k not in StreamedOptions.__optional_keys__]
    if unknown:  # as Python words it for a keyword the signature lacks
        raise TypeError(f"prune_streamed() got an unexpected keyword argument {unknown[0]!r}")
    if config is None:
        # None is refused by the config's own checks, as any bad method or amount
        return StreamedConfig(method, amount, **options)  # type: ignore[arg-type]
    if not isinstance(config, StreamedConfig):
        raise type_error(f"{OWNER}: invalid config={config!r}; expected a StreamedConfig, or None")
    given = [f"{n}={v!r}" for n, v in (("method", method), ("amount", amount)) if v is not None]
    if given or options:
        given += [f"{k}=" for k in options]
        raise value_error(
            f"{OWNER}: config= holds every option, but {', '.join(given)} came beside it; "
            "expected config=dataclasses.replace(config, ...) or the arguments alone"
        )
    return config


def open_streamed(
    path: str | os.PathLike[str], out: str | os.PathLike[str]
) -> tuple[Checkpoint, nn.Module, nn.ModuleList, Path]:
    """The sharded folder `path` opened to stream: its checkpoint (index and shard headers
    checked), its model on the meta device and its blocks (see `skeleton`), and the output
    folder `out`, checked to be writable and to have room for as many bytes as the shards."""
    checkpoint = open_checkpoint(path)
    model, blocks = skeleton(checkpoint.index.parent, checkpoint)
    folder = writable_folder(out, "the shards", checkpoint.index.parent)
    check_free(folder, sum(s.nbytes for s in checkpoint.tensors.values()))
    return checkpoint, model, blocks, folder


def check_free(folder: Path, need: int) -> None:
    """Refuse an output folder whose file system has fewer than `need` bytes free."""
    free = shutil.disk_usage(folder.parent).free
    if need > free:
        raise CheckpointError(f"{folder}: the output needs {need:,} bytes, {free:,} are free")


def check_tokens(batches: Sequence[object], owner: str, model: nn.Module | None = None) -> None:
    """Refuse batches whose every ``attention_mask`` keeps no token: nothing the caller
    counts as text would be calibrated on. A tuple or list batch's mask is the item that
    `model`'s forward names so (``core.example_inputs.named``); without a `model`, only a
    mapping's is seen (the caller checks again once the model is built)."""
    named_batches = [named(b, model) for b in batches]
    masks = [b.get("attention_mask") if isinstance(b, Mapping) else None for b in named_batches]
    if masks and all(isinstance(m, torch.Tensor) and not bool((m != 0).any()) for m in masks):
        raise value_error(
            f"{owner}: every attention_mask of the {len(batches)} calibration batches is all "
            "zero, so no token is left to calibrate on; expected batches whose attention_mask "
            "keeps at least one token"
        )


def _config(
    method: str,
    amount: float,
    pattern: Any,
    sequential: bool | str | None,
    damp: float | None,
    blocksize: int | None,
    progress: bool | None,
) -> Config:
    """The checked arguments; the methods and modes that stream, else a clear refusal."""
    if not isinstance(method, str) or method not in METHODS:
        raise value_error(
            f"{OWNER}: invalid method={method!r}; expected one of {', '.join(METHODS)} "
            "(the magnitude methods prune shards without the model: prune_sharded)"
        )
    config = Config(
        method=method,
        amount=amount,
        pattern=pattern,
        sequential=sequential,
        progress=progress,
        damp=damp,
        blocksize=blocksize,
        owner=OWNER,
    )
    if config.chosen_sequential is False:
        raise value_error(
            f"{OWNER}: sequential=False calibrates the whole model in one pass, which needs "
            "all of it in memory; expected True (block by block) or 'layers'"
        )
    return config


def skeleton(source: Path, checkpoint: Checkpoint) -> tuple[nn.Module, nn.ModuleList]:
    """The model of the folder's config, its parameters on the meta device, and its blocks;
    the tensors outside the blocks mapped from the shards. Refuses a family not streamed
    and shards that do not hold the model's parameters."""
    transformers = require("transformers", "hf", "streamed pruning")
    accelerate = require("accelerate", "hf", "streamed pruning")
    if not (source / "config.json").is_file():
        raise CheckpointError(
            f"{source}: no config.json; expected a Hugging Face model folder as "
            "save_pretrained writes it (the model is built from its config)"
        )
    try:
        config = transformers.AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as error:  # not JSON, or a config transformers cannot read
        raise CheckpointError(
            f"{source / 'config.json'}: cannot be read as a model config "
            f"({' '.join(str(error).split())[:200]}); expected the config.json save_pretrained "
            "writes"
        ) from None
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        raise value_error(
            f"{OWNER}: {source} holds a model of model_type={family!r}, which streamed "
            f"pruning does not know; expected one of {', '.join(FAMILIES)} (decoder-only "
            "models whose blocks are model.layers.<i>); prune it in memory with prune_model"
        )
    dtype = _dtype(checkpoint)
    with accelerate.init_empty_weights(include_buffers=False):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # a tied head is the embeddings' parameter, not stored apart
    blocks = model.model.layers
    inside = {id(p) for p in blocks.parameters()}
    for name, param in model.named_parameters():
        stored = _stored(checkpoint, name, param)
        if id(param) not in inside:
            put(model, name, stored)
    model.tie_weights()  # a tied head is the mapped embeddings' parameter again
    return model, blocks


def _dtype(checkpoint: Checkpoint) -> torch.dtype:
    """The floating dtype most of the shards' bytes are stored in (the model is built in
    it, and its config names it): a folder may keep a few tensors in another (a float32
    head beside bfloat16 blocks), whichever its index lists first."""
    sizes: dict[torch.dtype, int] = {}
    for stored in checkpoint.tensors.values():
        if stored.dtype.is_floating_point:
            sizes[stored.dtype] = sizes.get(stored.dtype, 0) + stored.nbytes
    if not sizes:
        raise CheckpointError(f"{checkpoint.index}: no floating-point tensor; expected weights")
    return max(sizes, key=lambda dtype: sizes[dtype])  # the first of the largest on a tie


def _stored(checkpoint: Checkpoint, name: str, param: torch.Tensor) -> Stored:
    """The stored tensor of the model's parameter `name`, checked against its shape."""
    stored = checkpoint.tensors.get(name)
    if stored is None:
        raise CheckpointError(
            f"{checkpoint.index}: the model of its config.json has a parameter {name!r} "
            "that the shards do not hold; expected shards written with that config"
        )
    if stored.shape != tuple(param.shape) or not stored.dtype.is_floating_point:
        raise CheckpointError(
            f"{checkpoint.index}: {name!r} is stored as {list(stored.shape)} of "
            f"{stored.code}; the config makes it {list(param.shape)} of floats"
        )
    return stored


def put(root: nn.Module, name: str, stored: Stored, dtype: torch.dtype | None = None) -> None:
    """Make the parameter `name` of `root` the stored tensor (mapped, not read; with
    `dtype`, a copy in that dtype)."""
    path, _, leaf = name.rpartition(".")
    module = root.get_submodule(path)
    tensor = stored.load()
    module._parameters[leaf] = nn.Parameter(tensor if dtype is None else tensor.to(dtype))


COMPUTE = {torch.bfloat16: torch.float32, torch.float16: torch.float32}
"""The dtype the blocks of a folder of half-precision weights are computed in. CPUs without
native bfloat16 or float16 arithmetic (AVX2 only, as here) multiply such matrices 5 to 10x
slower than float32 ones (512 tokens through a 5120 x 13824 linear layer: 14.2 s in
bfloat16, 2.0 s in float32, here). A block is then held in float32 (twice its bytes in
bfloat16); the pruned weights are written back in the stored dtype: Wanda's kept weights bit
for bit (the cast round-trips exactly), SparseGPT's updates rounded once."""


def computed_inputs(inputs: list[cal.Inputs]) -> list[cal.Inputs]:
    """The first block's inputs with their half-precision tensors in COMPUTE's dtype."""

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype in COMPUTE:
            return value.to(COMPUTE[value.dtype])
        if isinstance(value, tuple):  # the position embeddings (cos, sin)
            return tuple(cast(v) for v in value)
        return value

    return [
        (tuple(cast(a) for a in args), {k: cast(v) for k, v in kw.items()}) for args, kw in inputs
    ]


def _targets(block: nn.Module) -> list[TensorRef]:
    """The weight matrices prune_model's calibrated methods take in a block, in its order."""
    return [
        (module, leaf)
        for module in block.modules()
        for leaf, _ in module.named_parameters(recurse=False)
        if calibrates(module, leaf)
    ]


@dataclass
class _Run:
    """One streamed pruning's state: where it reads and writes, what it prunes with, and
    what it pruned so far."""

    model: nn.Module
    checkpoint: Checkpoint
    writer: Writer
    config: Config
    batches: Sequence[Any]
    bar: Progress
    paths: dict[nn.Module, str]
    numel: int = 0
    zeros: int = 0
    pruned: list[str] = field(default_factory=list)


def _stream(
    model: nn.Module,
    blocks: nn.ModuleList,
    checkpoint: Checkpoint,
    stage: Path,
    config: Config,
    batches: Sequence[Any],
    bar: Progress,
) -> tuple[int, int, int, list[str]]:
    """Write every tensor into `stage`: the blocks pruned one at a time, the rest copied.
    Returns the pruned entries, their zeros, the bytes written and the names pruned."""
    plans: dict[str, list[Planned]] = {}
    for name, s in checkpoint.tensors.items():
        plans.setdefault(s.path.name, []).append(Planned(name, s.code, s.shape))
    writer = Writer(stage, plans, {f: checkpoint.files.get(f, {}) for f in plans})
    paths = {m: p for p, m in model.named_modules()}
    run = _Run(model, checkpoint, writer, config, batches, bar, paths)
    prefixes = [f"{paths[block]}." for block in blocks]
    try:
        with cal.evaluating(model), torch.no_grad():
            inputs = computed_inputs(
                cal.capture_block_inputs(model, blocks[0], batches, owner=OWNER)
            )
            calls = cal.block_calls(model, blocks, batches, owner=OWNER)  # own mask, rotary
            for i, prefix in enumerate(prefixes):
                inputs = _one_block(run, blocks, i, prefix, inputs)
                if i + 1 < len(blocks):
                    inputs = computed_inputs(cal.called_as(inputs, calls, i + 1))
        for name, stored in checkpoint.tensors.items():
            if not name.startswith(tuple(prefixes)):
                writer.copy(name, stored)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    return run.numel, run.zeros, sum(writer.sizes.values()), run.pruned


def _one_block(
    run: _Run, blocks: nn.ModuleList, i: int, prefix: str, inputs: list[cal.Inputs]
) -> list[cal.Inputs]:
    """Map block `i` (its tensors named `prefix`...) from the shards, prune it on its
    `inputs`, write it, let it go; returns its outputs (the next block's inputs) if there
    is a next block."""
    block, tensors = blocks[i], run.checkpoint.tensors
    for name, _ in list(block.named_parameters()):
        stored = tensors[prefix + name]  # each in its own compute dtype (folders mix dtypes)
        put(run.model, prefix + name, stored, COMPUTE.get(stored.dtype))
    targets = _targets(block)
    plan = make_plan(
        block, targets, run.config, run.batches, None, paths=run.paths, forward=run.model
    )
    plan.keep_masks = False  # written as mask x orig: no mask kept beside a layer's values
    outputs = prune_block(plan, block, targets, inputs, run.bar, i + 1 < len(blocks))
    paths = {m: p for p, m in block.named_modules()}
    done = {prefix + (f"{paths[m]}.{leaf}" if paths[m] else leaf): (m, leaf) for m, leaf in targets}
    for name, stored in tensors.items():
        if not name.startswith(prefix):
            continue
        if name not in done:  # a norm, or a tensor that is no parameter (rotary frequencies)
            run.writer.copy(name, stored)
            continue
        module, leaf = done[name]
        values = stored_values(name, current_values(module, leaf), stored.dtype, OWNER)
        run.writer.write(name, 0, values.reshape(-1))
        run.numel += values.numel()
        run.zeros += int((values == 0).sum())
        run.pruned.append(name)
    blocks[i] = let_go(block)
    del block, plan, targets
    trim()
    return outputs


def let_go(block: nn.Module) -> nn.Module:
    """`block` with its tensors back on the meta device (masks and the masked weights
    the pruning added included) and without hooks (a pruning's hook keeps the last masked
    weight it made): its memory is freed once nothing else holds it. It never runs again."""
    for module in block.modules():
        module._forward_pre_hooks.clear()
        module._forward_hooks.clear()
        for key in list(module.__dict__):
            if isinstance(module.__dict__[key], torch.Tensor):
                del module.__dict__[key]  # a pruned weight, recomputed by its hook
        for key, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[key] = buffer.to("meta")
        for key, param in list(module._parameters.items()):
            if param is not None:
                module._parameters[key] = nn.Parameter(param.to("meta"), False)
    return block


def weight_map(checkpoint: Checkpoint) -> dict[str, str]:
    """The index's map of the output: every tensor in its file, in the input's order."""
    found = json.loads(checkpoint.index.read_text())["weight_map"]
    return {name: found.get(name, s.path.name) for name, s in checkpoint.tensors.items()}
