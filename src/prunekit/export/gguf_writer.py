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
writes the model's own float type (f16 for float16, bf16 for bfloat16, else f32);
``"source"`` (``request.GGUF_SOURCE``, with a GGUF file as ``source``) writes each matrix in
the type the source holds the tensor of its name in (``source_types``), so that a file whose
embedding is Q8_0 and the rest Q4_1 stays so: F16 where the source's type is one the ``gguf``
package does not quantize (the K and IQ types) or where the source has no such tensor. As
llama.cpp's own converter does, 1-D tensors (norms, biases, rotary factors) stay F32 in every
file type, and under a quantized type a matrix whose rows are not a multiple of its block
(32 values) is written F16; the report's notes name each matrix written F16 so and why.
``stored`` gives the values a tensor holds once so written (``written_types``: the type of
each parameter under ``"source"``).

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
from prunekit.export import gguf_reading
from prunekit.export.gguf_check import check_file, example_ids
from prunekit.export.gguf_vocab import Vocab, read_vocab
from prunekit.export.layer_widths import DecoderLayer, decoder_layers, uniform
from prunekit.export.request import GGUF_SOURCE, GGUF_TYPES, ExportReport, Request

__all__ = [
    "DTYPES",
    "FAMILIES",
    "Plan",
    "plan",
    "source_types",
    "stored",
    "write",
    "written_types",
]

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
        dtype: one of ``DTYPES``: the one asked for, or under ``"source"`` the type holding
            most of the tensors' bytes (the file type the metadata says).
        layers: each decoder layer's widths.
        tensors: GGUF name -> (the tensor to write, its type), in writing order.
        source: whether each tensor's type is its source's (``dtype`` ``"source"``).
        config: the scalar metadata: hidden, context, eps, rope_theta, vocab, name.
        vocab: the tokenizer fields.
        ids: the token ids the written file's logits are compared on.
        notes: what the report should say.
    """

    arch: str
    dtype: str
    layers: list[DecoderLayer]
    tensors: dict[str, tuple[torch.Tensor, gg.GGMLQuantizationType]]
    source: bool
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
            and ``deci`` cannot run, an unknown dtype, no or an unreadable tokenizer source,
            ``"source"`` with a source that is no GGUF file.
    """
    dtype = _dtype(model, request.dtype)
    kept = _kept_types(request.source) if dtype == GGUF_SOURCE else None
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
    tensors, tied, fallbacks = _tensors(model, layers, dtype, kept)
    _check_query_biases(tensors, int(_embedding(model).shape[1]))
    rope = _rope_factors(model)
    if rope is not None:
        tensors = {gg.TENSOR_NAMES[_T.ROPE_FREQS] + ".weight": (rope, DTYPES["f32"]), **tensors}
    vocab_rows = int(_embedding(model).shape[0])
    vocab = read_vocab(request.source, vocab_rows)
    settings = _settings(model, config, vocab_rows)
    if kept is not None:
        dtype = _main_type(tensors)
    notes = [f"architecture {arch}, {_types_note(tensors, kept is not None)}"]
    notes += _fallback_notes(fallbacks)
    if tied:
        notes.append("output tied to token_embd (no output.weight)")
    if kind == "mistral" and getattr(config, "sliding_window", None):
        notes.append(
            f"llama.cpp's llama/deci attend over the whole context: the model's sliding "
            f"window of {config.sliding_window} tokens applies beyond that length only in "
            f"transformers"
        )
    ids = example_ids(request.example_inputs, vocab_rows)
    return Plan(arch, dtype, layers, tensors, kept is not None, settings, vocab, ids,
                tuple(notes))  # fmt: skip


def _dtype(model: nn.Module, dtype: object) -> str:
    if dtype is None:
        first = next(iter(model.parameters()), None)
        return _OWN.get(first.dtype, "f32") if first is not None else "f32"
    if isinstance(dtype, str) and dtype.lower() == GGUF_SOURCE:
        return GGUF_SOURCE
    return _checked(dtype, f", {GGUF_SOURCE!r} (each tensor in its GGUF source's type)")


def _checked(dtype: object, more: str = "") -> str:
    if not isinstance(dtype, str) or dtype.lower() not in DTYPES:
        raise value_error(
            f"export: dtype={dtype!r} is not a GGUF tensor type it writes; expected one of "
            f"{', '.join(DTYPES)}{more} (or None: the model's own float type)"
        )
    return dtype.lower()


def source_types(path: Path) -> dict[str, str]:
    """The type the GGUF file at `path` holds each tensor in.

    Args:
        path: a GGUF file.

    Returns:
        GGUF tensor name -> ``GGMLQuantizationType`` name (``"Q8_0"``, ``"Q4_K"``, ``"F32"``).

    Raises:
        ValueError: `path` is no GGUF file the ``gguf`` package reads.
    """
    try:
        reader = gguf_reading.reader(path)
    except (ValueError, OSError) as error:
        raise value_error(
            f"export: dtype={GGUF_SOURCE!r} with source={str(path)!r}, which is no GGUF file "
            f"({error}); expected the GGUF file the model came from, or a dtype among "
            f"{', '.join(DTYPES)}"
        ) from None
    return {tensor.name: tensor.tensor_type.name for tensor in reader.tensors}


def _kept_types(source: Path | None) -> dict[str, str]:
    """`source`'s types (``source_types``), refusing a source that is no GGUF file."""
    if source is None or not source.is_file():
        what = "None" if source is None else f"{str(source)!r}, which is no file"
        raise value_error(
            f"export: dtype={GGUF_SOURCE!r} writes each tensor in the type its GGUF source "
            f"holds it in; source={what}; expected the GGUF file the model came from, or a "
            f"dtype among {', '.join(DTYPES)}"
        )
    return source_types(source)


def written_types(model: nn.Module, kept: dict[str, str]) -> dict[str, str]:
    """The type (a ``DTYPES`` name) each parameter of `model` is written in under
    ``"source"``, from its source's types `kept`: the source's type of the tensor of its GGUF
    name where it is one of ``DTYPES``, else ``"f16"`` (a type the ``gguf`` package does not
    quantize, or no such tensor in the source); ``"f32"`` for a 1-D tensor. ``stored``
    applies the rule for rows that are not whole blocks. A tied output weight takes the
    embedding's type (one tensor, ``token_embd``).

    Args:
        model: a Llama-family causal LM (its parameter names, as ``write`` names them).
        kept: GGUF name -> type name, from ``source_types``.

    Returns:
        Parameter name (``named_parameters``, tied ones included) -> ``DTYPES`` name; a
        parameter with no GGUF tensor (which ``write`` refuses) is left out.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    embed = params.get("model.embed_tokens.weight")
    found: dict[str, str] = {}
    for path, tensor in params.items():
        known = _known_name(path)
        if known is None:
            continue
        name = known[0]
        if path == "lm_head.weight" and tensor is embed:
            name = gg.TENSOR_NAMES[_T.TOKEN_EMBD] + ".weight"
        qtype, _ = _wanted(name, tensor, kept)
        found[path] = qtype.name.lower()
    return found


def _wanted(
    name: str, data: torch.Tensor, kept: dict[str, str]
) -> tuple[gg.GGMLQuantizationType, str | None]:
    """The type tensor `name` is written in under ``"source"`` before the rule for rows,
    and why it is not the source's (None: it is)."""
    if data.dim() < 2:
        return DTYPES["f32"], None
    held = kept.get(name)
    if held is None:
        return DTYPES["f16"], "not in the source"
    if held.lower() not in DTYPES:
        return DTYPES["f16"], (
            f"held in {held} by the source, a type the gguf package does not quantize "
            "(llama.cpp's llama-quantize makes it from this file)"
        )
    return DTYPES[held.lower()], None


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
    model: nn.Module, layers: list[DecoderLayer], dtype: str, kept: dict[str, str] | None
) -> tuple[dict[str, tuple[torch.Tensor, gg.GGMLQuantizationType]], bool, dict[str, str]]:
    """Every parameter under its GGUF name and type (`dtype`, or under ``"source"`` its
    source's in `kept`), q/k rows reordered for the rotation; whether the output is tied;
    why each matrix written F16 instead of the type meant is (GGUF name -> reason)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    embed = _embedding(model)
    head = params.get("lm_head.weight")
    tied = head is None or head is embed
    out: dict[str, tuple[torch.Tensor, gg.GGMLQuantizationType]] = {}
    fallbacks: dict[str, str] = {}
    for path, tensor in params.items():
        if path == "lm_head.weight" and tied:
            continue
        name, bid = _gguf_name(path)
        data = tensor.detach().to("cpu", torch.float32)
        if bid is not None and name.split(".")[2] in ("attn_q", "attn_k"):
            layer = layers[bid]
            heads = layer.heads if name.split(".")[2] == "attn_q" else layer.kv_heads
            data = data[_pairs(heads, layer.head_dim)]
        if kept is not None:
            meant, why = _wanted(name, data, kept)
        else:  # vectors are F32 in every file type, not in place of another
            meant, why = (DTYPES[dtype] if data.dim() >= 2 else DTYPES["f32"]), None
        qtype = _qtype(data, meant)
        if why is None and qtype != meant:
            block = gg.GGML_QUANT_SIZES[meant][0]
            why = (f"with rows of {data.shape[-1]} values, not whole {meant.name} blocks of "
                   f"{block}")  # fmt: skip
        if why is not None:
            fallbacks[name] = why
        out[name] = (data, qtype)
    return out, tied, fallbacks


def _embedding(model: nn.Module) -> torch.Tensor:
    """The token embedding's weight (rows = vocabulary, columns = hidden)."""
    hf: Any = model
    weight: torch.Tensor = hf.get_input_embeddings().weight
    return weight


def _known_name(path: str) -> tuple[str, int | None] | None:
    """The GGUF name of parameter `path` and its layer (None: llama.cpp has no tensor for it)."""
    stem, _, suffix = path.rpartition(".")
    parts = stem.split(".")
    if stem in _TOP and suffix == "weight":
        return gg.TENSOR_NAMES[_TOP[stem]] + ".weight", None
    if len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdecimal():
        key = _LAYER.get(".".join(parts[3:]))
        if key is not None and suffix in ("weight", "bias"):
            bid = int(parts[2])
            return gg.TENSOR_NAMES[key].format(bid=bid) + "." + suffix, bid
    return None


def _gguf_name(path: str) -> tuple[str, int | None]:
    known = _known_name(path)
    if known is not None:
        return known
    raise value_error(
        f"export: model has parameter {path!r}, which llama.cpp's llama and deci "
        f"architectures have no tensor for; expected only the Llama layout (embed_tokens, "
        f"q/k/v/o_proj and their biases, gate/up/down_proj, the RMS norms, lm_head)"
    )


def _pairs(heads: int, head_dim: int) -> torch.Tensor:
    """Row order that turns each head's two halves into interleaved pairs."""
    order = torch.arange(heads * head_dim).view(heads, 2, head_dim // 2)
    return order.transpose(1, 2).reshape(-1)


def _qtype(data: torch.Tensor, meant: gg.GGMLQuantizationType) -> gg.GGMLQuantizationType:
    """The type `data` is written in where `meant` is asked: F32 for a 1-D tensor, F16 for
    a matrix whose rows are not whole blocks of `meant`."""
    if data.dim() < 2:
        return DTYPES["f32"]
    if data.shape[-1] % gg.GGML_QUANT_SIZES[meant][0]:  # blocks of 32: quantized
        return DTYPES["f16"]
    return meant


def stored(tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    """The values `tensor` holds once written into a GGUF file of tensor type `dtype`, as
    float32: its 1-D tensors F32, its matrices in `dtype` (F16 under a quantized type where
    the rows are not a multiple of the block), quantized and dequantized by the ``gguf``
    package as the writer and the readers do. The order of the rows does not matter (each
    row is quantized alone), so the q/k rows need not be reordered first. Under ``"source"``
    each parameter's `dtype` is its entry of ``written_types``.

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
    qtype = _qtype(data, DTYPES[name])
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
    writer.add_file_type(_FILE_TYPES[settled.dtype])  # under "source": the main type's
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


def _types_note(
    tensors: dict[str, tuple[torch.Tensor, gg.GGMLQuantizationType]], source: bool
) -> str:
    counts: dict[str, int] = {}
    for _, qtype in tensors.values():
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    note = "tensors " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return note + (", in the source's types, tensor by tensor" if source else "")


def _fallback_notes(fallbacks: dict[str, str]) -> list[str]:
    """One note for each reason some matrices were written F16, naming them."""
    by_reason: dict[str, list[str]] = {}
    for name, why in fallbacks.items():
        by_reason.setdefault(why, []).append(name)
    notes = []
    for why, names in by_reason.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        count = f"{len(names)} matrix" if len(names) == 1 else f"{len(names)} matrices"
        notes.append(f"F16 for {count} {why}: {shown}")
    return notes


def _main_type(tensors: dict[str, tuple[torch.Tensor, gg.GGMLQuantizationType]]) -> str:
    """The ``DTYPES`` name of the type holding most of `tensors`' bytes."""
    sizes: dict[str, int] = {}
    for tensor, qtype in tensors.values():
        block, size = gg.GGML_QUANT_SIZES[qtype]
        name = qtype.name.lower()
        sizes[name] = sizes.get(name, 0) + tensor.numel() // block * size
    return max(sizes, key=lambda name: sizes[name]) if sizes else "f32"
