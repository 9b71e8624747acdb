"""The GGUF writer: one file that llama.cpp runs, written with the ``gguf`` package.

A Llama-family causal LM (``llama``, SmolLM2, ``mistral``, ``qwen2``) is written with
llama.cpp's ``llama`` architecture when every decoder layer has the same widths, and with its
``deci`` architecture when they differ: ``deci.feed_forward_length``,
``deci.attention.head_count`` and ``deci.attention.head_count_kv`` are then arrays of one
entry a layer. Both architectures rotate query and key pairs of consecutive values (llama.cpp's
"normal" rotary embedding), so the rows of every ``q_proj`` and ``k_proj`` (weights and
biases) are reordered within each head from Hugging Face's two halves into interleaved pairs.
Qwen2's query/key/value biases are read by both architectures, the query bias only at the
hidden width (llama.cpp's shape for it), so a model with attention biases whose query heads
were cut is refused. Qwen3's per-head query/key norms need llama.cpp's ``qwen3``
architecture, which cannot say per-layer widths: it is refused. Rotary scalings that only
divide the frequencies (``linear``, ``llama3``) are written as llama.cpp's ``rope_freqs``
factors; those that also scale attention or depend on the length (``yarn``, ``longrope``,
``dynamic``) are refused.

Tensor types (``dtype``): ``"f32"``, ``"f16"``, ``"bf16"``, or a block-quantized type
(``request.GGUF_QUANTIZED``: ``"q8_0"``, ``"q5_1"``, ``"q5_0"``, ``"q4_1"``, ``"q4_0"``); None
writes the model's own float type (f16 for float16, bf16 for bfloat16, else f32). As
llama.cpp's own converter does, 1-D tensors (norms, biases, rotary factors) stay F32 in every
file type, and under a quantized type a matrix whose rows are not a multiple of its block
(32 values) is written F16. ``stored`` gives the values a tensor holds once so written.

The tokenizer comes from ``source``: a GGUF file (every ``tokenizer.*`` field is copied) or a
Hugging Face folder (see ``gguf_vocab``); without one the file would not run, so it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf as gg
import numpy as np
import torch
from torch import nn

from prunekit.core.errors import type_error, value_error
from prunekit.dropin.calls import is_pruned
from prunekit.export.gguf_check import check_file, example_ids
from prunekit.export.gguf_vocab import Vocab, read_vocab
from prunekit.export.layer_widths import DecoderLayer, decoder_layers, uniform
from prunekit.export.request import GGUF_TYPES, ExportReport, Request

__all__ = ["DTYPES", "FAMILIES", "Plan", "plan", "stored", "write"]

# the tensor types it writes (``request.GGUF_TYPES``), by the names `dtype` takes
DTYPES: dict[str, gg.GGMLQuantizationType] = {
    name: gg.GGMLQuantizationType[name.upper()] for name in GGUF_TYPES
}
_FILE_TYPES = {
    "f32": gg.LlamaFileType.ALL_F32,
    "f16": gg.LlamaFileType.MOSTLY_F16,
    "bf16": gg.LlamaFileType.MOSTLY_BF16,
    "q8_0": gg.LlamaFileType.MOSTLY_Q8_0,
    "q5_1": gg.LlamaFileType.MOSTLY_Q5_1,
    "q5_0": gg.LlamaFileType.MOSTLY_Q5_0,
    "q4_1": gg.LlamaFileType.MOSTLY_Q4_1,
    "q4_0": gg.LlamaFileType.MOSTLY_Q4_0,
}
_OWN = {torch.float16: "f16", torch.bfloat16: "bf16"}

# config.model_type of the families it writes (qwen3 is refused: see the module's docstring)
FAMILIES = ("llama", "mistral", "qwen2")

_T = gg.MODEL_TENSOR
# a decoder layer's parameters (after "model.layers.{i}.") and llama.cpp's tensor for each
_LAYER = {
    "input_layernorm": _T.ATTN_NORM,
    "self_attn.q_proj": _T.ATTN_Q,
    "self_attn.k_proj": _T.ATTN_K,
    "self_attn.v_proj": _T.ATTN_V,
    "self_attn.o_proj": _T.ATTN_OUT,
    "post_attention_layernorm": _T.FFN_NORM,
    "mlp.gate_proj": _T.FFN_GATE,
    "mlp.up_proj": _T.FFN_UP,
    "mlp.down_proj": _T.FFN_DOWN,
}
_TOP = {"model.embed_tokens": _T.TOKEN_EMBD, "model.norm": _T.OUTPUT_NORM, "lm_head": _T.OUTPUT}


@dataclass(frozen=True)
class Plan:
    """What will be written, settled (and every refusal made) before anything is.

    Attributes:
        arch: ``"llama"`` or ``"deci"``.
        dtype: one of ``DTYPES``.
        layers: each decoder layer's widths.
        tensors: GGUF name -> (the tensor to write, its type), in writing order.
        config: the scalar metadata: hidden, context, eps, rope_theta, vocab, name.
        vocab: the tokenizer fields.
        ids: the token ids the written file's logits are compared on.
        notes: what the report should say.
    """

    arch: str
    dtype: str
    layers: list[DecoderLayer]
    tensors: dict[str, tuple[torch.Tensor, gg.GGMLQuantizationType]]
    config: dict[str, Any]
    vocab: Vocab
    ids: torch.Tensor
    notes: tuple[str, ...]


def write(model: nn.Module, target: Path, request: Request) -> ExportReport:
    """Write `model` as one GGUF file at `target` and check it (``export``'s gguf writer).

    Args:
        model: a compacted Hugging Face causal LM of the Llama family.
        target: the staged file to write.
        request: the checked call; ``source`` gives the tokenizer, ``dtype`` the tensor type.

    Returns:
        What was written and how it was checked.

    Raises:
        ValueError, TypeError: a model, source or dtype it cannot write (before writing).
        RuntimeError: the file read back differs from the model.
    """
    settled = plan(model, request)
    writer = gg.GGUFWriter(str(target), settled.arch)
    _metadata(writer, settled)
    settled.vocab.add_to(writer)
    for name, (tensor, qtype) in settled.tensors.items():
        writer.add_tensor(name, _encode(tensor, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    by, difference, notes = check_file(target, model, settled, request)
    return ExportReport("gguf", request.path, (request.path.name,), by, difference,
                        settled.notes + notes)  # fmt: skip


def plan(model: nn.Module, request: Request) -> Plan:
    """Settle what `model` is written as, refusing what llama.cpp could not run.

    Args:
        model: the model to write.
        request: the checked call.

    Returns:
        The plan ``write`` follows.

    Raises:
        ValueError, TypeError: masks still installed, a family or layer llama.cpp's ``llama``
            and ``deci`` cannot run, an unknown dtype, no or an unreadable tokenizer source.
    """
    dtype = _dtype(model, request.dtype)
    masked = [name for name, _ in model.named_buffers() if name.endswith("_mask")]
    if masked or is_pruned(model):  # torch.nn.utils.prune's masks too, as the hf check
        which = f" ({masked[0]})" if masked else ""
        raise value_error(
            f"export: model still has pruning masks installed{which}; expected a compacted "
            "model: call prunekit.compact(model, example_inputs) (or remove() on each masked "
            "tensor, torch.nn.utils.prune's for its own masks) before format='gguf'"
        )
    config: Any = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind == "qwen3":
        raise value_error(
            "export: model is a qwen3, whose per-head q_norm/k_norm only llama.cpp's qwen3 "
            "architecture reads, and format='gguf' writes the llama and deci architectures; "
            "expected llama, mistral or qwen2 (export qwen3 with format='hf')"
        )
    if kind not in FAMILIES:
        raise type_error(
            f"export: format='gguf' writes Llama-family causal LMs; model has "
            f"config.model_type {kind!r}; expected one of {', '.join(FAMILIES)}"
        )
    layers = decoder_layers(model)
    _check_layers(config, layers)
    arch = "llama" if uniform(layers) else "deci"
    tensors, tied = _tensors(model, layers, dtype)
    _check_query_biases(tensors, int(_embedding(model).shape[1]))
    rope = _rope_factors(model)
    if rope is not None:
        tensors = {gg.TENSOR_NAMES[_T.ROPE_FREQS] + ".weight": (rope, DTYPES["f32"]), **tensors}
    vocab_rows = int(_embedding(model).shape[0])
    vocab = read_vocab(request.source, vocab_rows)
    settings = _settings(model, config, vocab_rows)
    notes = [f"architecture {arch}, {_types_note(tensors)}"]
    if tied:
        notes.append("output tied to token_embd (no output.weight)")
    if kind == "mistral" and getattr(config, "sliding_window", None):
        notes.append(
            f"llama.cpp's llama/deci attend over the whole context: the model's sliding "
            f"window of {config.sliding_window} tokens applies beyond that length only in "
            f"transformers"
        )
    ids = example_ids(request.example_inputs, vocab_rows)
    return Plan(arch, dtype, layers, tensors, settings, vocab, ids, tuple(notes))


def _dtype(model: nn.Module, dtype: object) -> str:
    if dtype is None:
        first = next(iter(model.parameters()), None)
        return _OWN.get(first.dtype, "f32") if first is not None else "f32"
    return _checked(dtype)


def _checked(dtype: object) -> str:
    if not isinstance(dtype, str) or dtype.lower() not in DTYPES:
        raise value_error(
            f"export: dtype={dtype!r} is not a GGUF tensor type it writes; expected one of "
            f"{', '.join(DTYPES)} (or None: the model's own float type)"
        )
    return dtype.lower()


def _check_layers(config: Any, layers: list[DecoderLayer]) -> None:
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise value_error(
            f"export: model has config.hidden_act {act!r}; llama.cpp's llama and deci gate "
            f"the MLP with 'silu' only"
        )
    kinds = set(getattr(config, "layer_types", None) or ())
    if kinds - {"full_attention"}:
        raise value_error(
            f"export: model has config.layer_types {sorted(kinds)}; llama.cpp's llama and "
            f"deci have full attention only, expected every layer 'full_attention'"
        )
    for i, layer in enumerate(layers):
        if layer.head_dim != layers[0].head_dim:
            raise value_error(
                f"export: model.layers.{i}.self_attn has head_dim {layer.head_dim} and "
                f"model.layers.0 {layers[0].head_dim}; GGUF has one head width for all layers"
            )
        if layer.ffn == 0:
            raise value_error(
                f"export: model.layers.{i}.mlp has no units left; llama.cpp's deci skips the "
                f"rest of such a layer, so it would lose its attention output: prune with "
                f"a smaller amount or a Budget that keeps at least one unit"
            )


def _check_query_biases(
    tensors: dict[str, tuple[torch.Tensor, gg.GGMLQuantizationType]], hidden: int
) -> None:
    """Refuse a query bias llama.cpp cannot load: its llama and deci architectures read
    ``attn_q.bias`` as a vector of the hidden width, whatever the layer's query heads, so a
    bias of the heads left after a cut fails the file's load ("wrong shape")."""
    suffix = gg.TENSOR_NAMES[_T.ATTN_Q].removeprefix("blk.{bid}") + ".bias"
    for name, (tensor, _) in tensors.items():
        if name.endswith(suffix) and tensor.numel() != hidden:
            layer = name.split(".")[1]
            raise value_error(
                f"export: model.layers.{layer}.self_attn.q_proj.bias has {tensor.numel()} "
                f"entries and the hidden width {hidden}; llama.cpp's llama and deci "
                f"architectures read a query bias of the hidden width only, so the file would "
                f"not load: export with format='hf', or prune a model with attention biases "
                f"without cutting its query heads (Budget(kinds=('channels',)), or heads=0)"
            )


def _tensors(
    model: nn.Module, layers: list[DecoderLayer], dtype: str
) -> tuple[dict[str, tuple[torch.Tensor, gg.GGMLQuantizationType]], bool]:
    """Every parameter under its GGUF name and type, q/k rows reordered for the rotation."""
    params = dict(model.named_parameters(remove_duplicate=False))
    embed = _embedding(model)
    head = params.get("lm_head.weight")
    tied = head is None or head is embed
    out: dict[str, tuple[torch.Tensor, gg.GGMLQuantizationType]] = {}
    for path, tensor in params.items():
        if path == "lm_head.weight" and tied:
            continue
        name, bid = _gguf_name(path)
        data = tensor.detach().to("cpu", torch.float32)
        if bid is not None and name.split(".")[2] in ("attn_q", "attn_k"):
            layer = layers[bid]
            heads = layer.heads if name.split(".")[2] == "attn_q" else layer.kv_heads
            data = data[_pairs(heads, layer.head_dim)]
        out[name] = (data, _qtype(name, data, dtype))
    return out, tied


def _embedding(model: nn.Module) -> torch.Tensor:
    """The token embedding's weight (rows = vocabulary, columns = hidden)."""
    hf: Any = model
    weight: torch.Tensor = hf.get_input_embeddings().weight
    return weight


def _gguf_name(path: str) -> tuple[str, int | None]:
    stem, _, suffix = path.rpartition(".")
    parts = stem.split(".")
    if stem in _TOP and suffix == "weight":
        return gg.TENSOR_NAMES[_TOP[stem]] + ".weight", None
    if len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdecimal():
        key = _LAYER.get(".".join(parts[3:]))
        if key is not None and suffix in ("weight", "bias"):
            bid = int(parts[2])
            return gg.TENSOR_NAMES[key].format(bid=bid) + "." + suffix, bid
    raise value_error(
        f"export: model has parameter {path!r}, which llama.cpp's llama and deci "
        f"architectures have no tensor for; expected only the Llama layout (embed_tokens, "
        f"q/k/v/o_proj and their biases, gate/up/down_proj, the RMS norms, lm_head)"
    )


def _pairs(heads: int, head_dim: int) -> torch.Tensor:
    """Row order that turns each head's two halves into interleaved pairs."""
    order = torch.arange(heads * head_dim).view(heads, 2, head_dim // 2)
    return order.transpose(1, 2).reshape(-1)


def _qtype(name: str, data: torch.Tensor, dtype: str) -> gg.GGMLQuantizationType:
    if data.dim() < 2:
        return DTYPES["f32"]
    if data.shape[-1] % gg.GGML_QUANT_SIZES[DTYPES[dtype]][0]:  # blocks of 32: quantized
        return DTYPES["f16"]
    return DTYPES[dtype]


def stored(tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    """The values `tensor` holds once written into a GGUF file of tensor type `dtype`, as
    float32: its 1-D tensors F32, its matrices in `dtype` (F16 under a quantized type where
    the rows are not a multiple of the block), quantized and dequantized by the ``gguf``
    package as the writer and the readers do. The order of the rows does not matter (each
    row is quantized alone), so the q/k rows need not be reordered first.

    Args:
        tensor: a floating tensor of the model.
        dtype: one of ``DTYPES``.

    Returns:
        A new float32 tensor of `tensor`'s shape.

    Raises:
        ValueError: `dtype` is not one of ``DTYPES``.
    """
    name = _checked(dtype)
    data = tensor.detach().to("cpu", torch.float32)
    qtype = _qtype("", data, name)
    if qtype == DTYPES["f32"]:
        return data.clone()
    with np.errstate(over="ignore", invalid="ignore"):  # an inf scale: the caller's to say
        values = gg.quants.dequantize(_encode(data.contiguous(), qtype), qtype)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(data.shape)


def _encode(tensor: torch.Tensor, qtype: gg.GGMLQuantizationType) -> np.ndarray[Any, Any]:
    data = tensor.numpy()
    if qtype == DTYPES["f32"]:
        return data
    if qtype == DTYPES["f16"]:
        return data.astype(np.float16)
    return gg.quants.quantize(data, qtype)


def _rope_factors(model: nn.Module) -> torch.Tensor | None:
    """llama.cpp's ``rope_freqs``: what each rotary frequency is divided by (None: all 1)."""
    base: Any = getattr(model, "model", model)
    rotary = getattr(base, "rotary_emb", None)
    kind = getattr(rotary, "rope_type", "default")
    if kind == "default":
        return None
    scaling = float(getattr(rotary, "attention_scaling", 1.0))
    if kind not in ("linear", "llama3") or scaling != 1.0:
        raise value_error(
            f"export: model has rope_type {kind!r} (attention scaling {scaling}); "
            f"format='gguf' writes 'default', 'linear' and 'llama3' rotary embeddings"
        )
    config: Any = getattr(model, "config", None)
    theta = float(config.rope_parameters["rope_theta"])
    inv_freq: torch.Tensor = rotary.inv_freq  # type: ignore[union-attr]
    dim = int(inv_freq.numel()) * 2
    plain = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    factors: torch.Tensor = (plain / inv_freq.double()).float()
    return factors


def _settings(model: nn.Module, config: Any, vocab_rows: int) -> dict[str, Any]:
    base: Any = getattr(model, "model", model)
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    name = Path(str(getattr(config, "_name_or_path", "") or config.model_type)).name
    return {
        "hidden": int(_embedding(model).shape[1]),
        "context": int(config.max_position_embeddings),
        "eps": float(base.norm.variance_epsilon),
        "rope_theta": float(theta),
        "vocab": vocab_rows,
        "name": f"{name} (pruned)",
    }


def _metadata(writer: gg.GGUFWriter, settled: Plan) -> None:
    c, layers = settled.config, settled.layers
    writer.add_name(c["name"])
    writer.add_file_type(_FILE_TYPES[settled.dtype])
    writer.add_quantization_version(gg.GGML_QUANT_VERSION)
    writer.add_vocab_size(c["vocab"])
    writer.add_context_length(c["context"])
    writer.add_embedding_length(c["hidden"])
    writer.add_block_count(len(layers))
    if settled.arch == "llama":
        writer.add_feed_forward_length(layers[0].ffn)
        writer.add_head_count(layers[0].heads)
        writer.add_head_count_kv(layers[0].kv_heads)
    else:
        writer.add_feed_forward_length([layer.ffn for layer in layers])
        writer.add_head_count([layer.heads for layer in layers])
        writer.add_head_count_kv([layer.kv_heads for layer in layers])
    writer.add_rope_freq_base(c["rope_theta"])
    writer.add_layer_norm_rms_eps(c["eps"])
    writer.add_key_length(layers[0].head_dim)
    writer.add_value_length(layers[0].head_dim)
    writer.add_rope_dimension_count(layers[0].head_dim)


def _types_note(tensors: dict[str, tuple[torch.Tensor, gg.GGMLQuantizationType]]) -> str:
    counts: dict[str, int] = {}
    for _, qtype in tensors.values():
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    return "tensors " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
