"""Attention heads, found by module: one small adapter per family, keyed by class name.

The tracer cannot follow channels through the attention product (heads split the width
into several dims; rotary embeddings slice each head), but every attention family computes
the same thing: query/key/value projections whose rows come in heads of ``head_dim``, and an
output projection whose columns read them. So a module an adapter knows is traced as a
whole (its inner ops run untraced): the adapter reads the projections off the module, and
one shared routine records a group per module whose unit is a head: its query, key and
value rows (and biases) and its output projection's columns. Masking those is exact with
respect to removing the head (the head's output is read through masked columns only). The
hidden width the projections read and the output projection writes joins the residual
stream as any layer's channels do. A module whose structure does not fit (cross attention,
a weight made in forward) blocks its channels and says why; an attention no adapter knows
blocks at its matmul/softmax as before. Matching by class name keeps ``import prunekit``
free of transformers; a family with the same structure is added to ``ADAPTERS``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten

from prunekit.structure.families import mha
from prunekit.structure.families.heads import Adapter, Follow, Heads, Proj, first
from prunekit.structure.handlers.module_handlers import is_norm_module
from prunekit.structure.trace.labels import along, channel_ids
from prunekit.structure.trace.tracer import ModuleHandler, Tracer


def _input(args: tuple[Any, ...], kwargs: dict[str, Any], name: str = "hidden_states") -> Any:
    return kwargs.get(name, args[0] if args else None)


def _linears(module: nn.Module, names: tuple[str, ...]) -> list[nn.Linear] | str:
    found = [getattr(module, n, None) for n in names]
    if not all(isinstance(m, nn.Linear) for m in found):
        return f"its projections {'/'.join(names)} are not all Linear layers"
    return found  # type: ignore[return-value]


def _counts(q_rows: int, kv_rows: int, head_dim: Any) -> tuple[int, int] | str:
    if not isinstance(head_dim, int) or head_dim < 1 or q_rows % head_dim or kv_rows % head_dim:
        return f"its projections ({q_rows}, {kv_rows} rows) are not heads of {head_dim}"
    heads, kv = q_rows // head_dim, kv_rows // head_dim
    if heads % kv:
        return f"its {heads} query heads do not split into {kv} key/value groups"
    return heads, kv


def _read_qkvo(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               out: Any) -> Heads | str:  # fmt: skip
    """q_proj, k_proj, v_proj, o_proj (or out_proj: the BART-style families in QKV_OUT):
    LLaMA and the families in QKVO, (Hugging Face 5) ViT."""
    if (
        kwargs.get("key_value_states") is not None
        or kwargs.get("encoder_hidden_states") is not None
    ):
        return "cross attention is not handled"
    found = _linears(module, ("q_proj", "k_proj", "v_proj", _out_name(module)))
    if isinstance(found, str):
        return found
    if isinstance(getattr(module, "gate_proj", None), nn.Module):
        return "its output gate (gate_proj) is not handled"
    q, k, v, o = found
    counts = _counts(q.out_features, k.out_features, getattr(module, "head_dim", None))
    if isinstance(counts, str):
        return counts
    heads, kv = counts
    groups = getattr(module, "num_key_value_groups", heads // kv)
    if v.out_features != k.out_features or o.in_features != q.out_features:
        return "its value or output projection does not match its heads"
    if groups != heads // kv:
        return f"num_key_value_groups={groups} does not match {heads} heads over {kv} groups"
    follows = _qk_norms(module, heads, kv, module.head_dim)
    if isinstance(follows, str):
        return follows
    sinks = getattr(module, "sinks", None)  # GPT-OSS: one attention-sink logit per head
    if isinstance(sinks, Tensor):
        if tuple(sinks.shape) != (heads,):
            return f"its sinks ({tuple(sinks.shape)}) are not one per query head ({heads})"
        follows += (Follow(module, "sinks", "q", per_head=True),)
    x = _input(args, kwargs)
    return Heads(Proj(q), Proj(k), Proj(v), Proj(o), heads, kv, module.head_dim, (x, x, x),
                 first(out), follows)  # fmt: skip


def _qk_norms(module: nn.Module, heads: int, kv: int, d: int) -> tuple[Follow, ...] | str:
    """The query/key norms of Qwen3, Gemma 3, OLMo 2, Cohere: over each head's head_dim
    (one weight shared by all heads: nothing to follow), over the whole projected width
    (OLMo 2: its weight follows the rows, its statistics the kept heads) or per head."""
    found = []
    for side, name, count in (("q", "q_norm", heads), ("k", "k_norm", kv)):
        norm = getattr(module, name, None)
        if norm is None:
            continue
        weight = getattr(norm, "weight", None)
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else None
        if shape == (d,):  # a masked head's output is read through masked columns only
            continue
        if shape == (count * d,) and is_norm_module(norm) and getattr(norm, "bias", None) is None:
            found.append(Follow(norm, "weight", side, whole=True))
        elif shape == (count, d) and getattr(norm, "bias", None) is None:
            found.append(Follow(norm, "weight", side, per_head=True))
        else:
            return f"its {name} (weight {shape}) is not over head_dim={d}, the width or the heads"
    return tuple(found)


def _out_name(module: nn.Module) -> str:
    return "out_proj" if type(module).__name__ in QKV_OUT else "o_proj"


def _update_qkvo(module: Any) -> tuple[int, int, int, int]:
    d = int(module.head_dim)
    heads = module.q_proj.out_features // d
    kv = module.k_proj.out_features // d
    _set(module, num_key_value_groups=heads // kv, num_heads=heads, num_attention_heads=heads,
         num_key_value_heads=kv)  # fmt: skip
    if _out_name(module) == "out_proj":  # BART-style: embed_dim is the hidden width
        _set(module, embed_dim=module.q_proj.in_features)
    return heads, kv, d, module.q_proj.in_features


def _read_fused(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                out: Any) -> Heads | str:  # fmt: skip
    """Phi-3: one Linear qkv_proj (query rows, then key rows, then value rows), o_proj."""
    found = _linears(module, ("qkv_proj", "o_proj"))
    if isinstance(found, str):
        return found
    qkv, o = found
    d = getattr(module, "head_dim", None)
    if not isinstance(d, int) or d < 1 or (qkv.out_features - o.in_features) % (2 * d):
        return f"its qkv_proj ({qkv.out_features} rows) is not query heads and 2 x key/value heads"
    kv_rows = (qkv.out_features - o.in_features) // 2
    counts = _counts(o.in_features, kv_rows, d)
    if isinstance(counts, str):
        return counts
    heads, kv = counts
    x = _input(args, kwargs)
    q_rows = o.in_features
    parts = [Proj(qkv, offset=start) for start in (0, q_rows, q_rows + kv_rows)]
    return Heads(parts[0], parts[1], parts[2], Proj(o), heads, kv, d, (x, x, x), first(out))


def _update_fused(module: Any) -> tuple[int, int, int, int]:
    d = int(module.head_dim)
    heads = module.o_proj.in_features // d
    kv = (module.qkv_proj.out_features - heads * d) // (2 * d)
    _set(module, num_key_value_groups=heads // kv, num_heads=heads, num_attention_heads=heads,
         num_key_value_heads=kv)  # fmt: skip
    return heads, kv, d, module.qkv_proj.in_features


def _set(module: nn.Module, **values: int) -> None:
    """Set those of the attributes the module has."""
    for name, value in values.items():
        if isinstance(getattr(module, name, None), int):
            setattr(module, name, value)


def _read_bert(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               out: Any) -> Heads | str:  # fmt: skip
    """BERT-style self-attention: query, key, value; a sibling (output.dense) projects."""
    found = _linears(module, ("query", "key", "value"))
    if isinstance(found, str):
        return found
    if kwargs.get("encoder_hidden_states") is not None:
        return "cross attention is not handled"
    q, k, v = found
    counts = _counts(q.out_features, k.out_features, getattr(module, "attention_head_size", None))
    if isinstance(counts, str):
        return counts
    if counts[0] != counts[1] or v.out_features != k.out_features:
        return "its key and value projections do not match its query heads"
    x = _input(args, kwargs)
    return Heads(Proj(q), Proj(k), Proj(v), None, counts[0], counts[0],
                 module.attention_head_size, (x, x, x), first(out))  # fmt: skip


def _update_bert(module: Any) -> tuple[int, int, int, int]:
    rows, d = module.query.out_features, module.attention_head_size
    _set(module, num_attention_heads=rows // d, all_head_size=rows)
    return rows // d, rows // d, d, module.query.in_features


def _read_gpt2(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               out: Any) -> Heads | str:  # fmt: skip
    """GPT-2: one fused Conv1D c_attn (weight (hidden, 3 x split_size)), Conv1D c_proj."""
    attn: Any = getattr(module, "c_attn", None)
    proj: Any = getattr(module, "c_proj", None)
    if (
        getattr(module, "is_cross_attention", False)
        or kwargs.get("encoder_hidden_states") is not None
    ):
        return "cross attention is not handled"
    if type(attn).__name__ != "Conv1D" or type(proj).__name__ != "Conv1D":
        return "its c_attn/c_proj are not Conv1D layers"
    shape = tuple(getattr(attn, "weight").shape)  # noqa: B009  (typed as Any)
    split, d = getattr(module, "split_size", None), getattr(module, "head_dim", 0)
    if not isinstance(split, int) or shape[1] != 3 * split:
        return f"its c_attn ({shape}) is not 3 x split_size={split}"
    counts = _counts(split, split, d)
    if isinstance(counts, str):
        return counts
    x = _input(args, kwargs)
    parts = [Proj(attn, out_dim=1, offset=k * split, op="addmm") for k in range(3)]
    o = Proj(proj, out_dim=1, op="addmm")
    heads = counts[0]
    return Heads(parts[0], parts[1], parts[2], o, heads, heads, int(d), (x, x, x), first(out))


def _update_gpt2(module: Any) -> tuple[int, int, int, int]:
    heads = module.c_proj.weight.shape[0] // module.head_dim
    module.num_heads = heads
    module.split_size = heads * module.head_dim
    module.embed_dim = module.c_attn.weight.shape[0]
    return heads, heads, module.head_dim, module.embed_dim


# q_proj/k_proj/v_proj/o_proj families, each checked by benchmarks/families.py (heads
# pruned and compacted exactly, generate() equal); q/k norms handled by _qk_norms
QKVO = (
    "LlamaAttention", "MistralAttention", "Qwen2Attention", "ViTAttention", "Qwen3Attention",
    "Qwen2MoeAttention", "Qwen3MoeAttention", "MixtralAttention", "OlmoeAttention",
    "GemmaAttention", "Gemma2Attention", "Gemma3Attention", "VaultGemmaAttention",
    "OlmoAttention", "Olmo2Attention", "Olmo3Attention", "FlexOlmoAttention",
    "GraniteAttention", "CohereAttention", "Cohere2Attention", "Cohere2MoeAttention",
    "ApertusAttention", "ArceeAttention", "CwmAttention", "DogeAttention", "Ernie4_5Attention",
    "Exaone4Attention", "GlmAttention", "Glm4Attention", "HeliumAttention",
    "HunYuanDenseV1Attention", "HunYuanMoEV1Attention", "HyperCLOVAXAttention",
    "Jais2Attention", "MellumAttention", "MinistralAttention", "Ministral3Attention",
    "SeedOssAttention", "SmolLM3Attention", "Starcoder2Attention",
    "AfmoeAttention", "AriaTextAttention", "BeamAttention",
    "Ernie4_5_MoeAttention", "ExaoneMoeAttention", "FalconH1Attention", "FlintAttention",
    "Glm4MoeAttention", "GptOssAttention", "GraniteSWAAttention", "GraniteMoeAttention",
    "GraniteMoeSWAAttention", "GraniteMoeSharedAttention", "HYV3Attention",
    "Inkling2SlidingAttention", "Kolibri1Attention",
    "Llama4TextAttention", "MiMoV2FlashAttention", "MiniMaxAttention", "MiniMaxM2Attention",
    "MiniMaxM3VLAttention", "MllamaTextSelfAttention", "NanoChatAttention", "NemotronAttention",
    "NemotronHAttention", "OlmoHybridAttention", "PhimoeAttention", "SolarOpenAttention",
    "StableLmAttention",
)  # fmt: skip
# the same with out_proj (BART-style self-attention; cross attention is refused)
QKV_OUT = (
    "BioGptAttention", "OPTAttention", "BartAttention", "MBartAttention",
    "PegasusAttention", "MarianAttention", "BlenderbotAttention", "BlenderbotSmallAttention",
    "MvpAttention", "BigBirdPegasusDecoderAttention",
)  # fmt: skip


def _read_input_width(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      out: Any) -> Heads | str:  # fmt: skip
    """TrOCR: q/k/v/out_proj as BART's, but its heads' output is reshaped to the width of
    its input (``embed_dim`` read off hidden_states' shape): neither its heads nor the
    hidden width it reads can change, which nothing in the trace shows."""
    return (
        "it reshapes its heads' output to the width of its input (read off the input's "
        "shape), so neither its heads nor that width can change"
    )


# the one table of attention families, by class name (torch's MHA by type: ``adapter_of``)
ADAPTERS: dict[str, Adapter] = {
    **dict.fromkeys(QKVO + QKV_OUT, Adapter(_read_qkvo, _update_qkvo)),
    "Phi3Attention": Adapter(_read_fused, _update_fused),
    # QKV_OUT's layout, but its output width is its input's
    "TrOCRAttention": Adapter(_read_input_width, _update_qkvo),
    "BertSelfAttention": Adapter(_read_bert, _update_bert),
    "GPT2Attention": Adapter(_read_gpt2, _update_gpt2),
    "MultiheadAttention": mha.ADAPTER,
}


def adapter_of(module: nn.Module) -> Adapter | None:
    """The adapter of a module: by class name for Hugging Face's, by type for torch's MHA."""
    found = ADAPTERS.get(type(module).__name__)
    if found is not None and type(module).__module__.startswith("transformers."):
        return found
    return ADAPTERS.get("MultiheadAttention") if isinstance(module, nn.MultiheadAttention) else None


def _trace(tr: Tracer, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
           out: Any) -> None:  # fmt: skip
    adapter = adapter_of(module)
    assert adapter is not None
    where = f"{type(module).__name__} (in {tr.names.get(id(module)) or 'the model'})"
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]
    found = adapter.read(module, args, kwargs, out)
    if isinstance(found, str) or not _owned(tr, found):
        why = found if isinstance(found, str) else "a projection weight is no model parameter"
        for t in tensors:
            tr.block(tr.label(t), f"{where}: {why}")
        return
    read = {id(t) for t in found.inputs}
    for t in tensors:
        if id(t) not in read:
            tr.block(tr.label(t), f"they reach {where} as an input it does not project")
    q_ids = _head_ids(tr, found)
    seen: dict[int, Tensor | None] = {}
    for x in found.inputs:
        if id(x) not in seen:
            seen[id(x)] = _channels(tr, x, where)
    chans = [seen[id(x)] for x in found.inputs]
    _columns(tr, (found.q, found.k, found.v), chans, where)
    if found.o is None:
        if isinstance(found.out, Tensor) and found.out.shape[-1] == len(q_ids):
            tr.set(found.out, along(q_ids, found.out.dim() - 1, found.out.shape))
        return
    o = found.o
    weight = getattr(o.module, o.weight)
    positions = torch.arange(len(q_ids))
    tr.record(tr.owner(weight), 1 - o.out_dim, "in", positions, q_ids, positions, op=o.op)
    new = tr.new_ids(weight.shape[o.out_dim])
    _rows(tr, o, new)
    if isinstance(found.out, Tensor) and found.out.shape[-1] == len(new):
        tr.set(found.out, along(new, found.out.dim() - 1, found.out.shape))


def _owned(tr: Tracer, found: Heads) -> bool:
    projs = [found.q, found.k, found.v] + ([found.o] if found.o is not None else [])
    return all(tr.owner(getattr(p.module, p.weight)) is not None for p in projs)


def _head_ids(tr: Tracer, found: Heads) -> Tensor:
    """New ids for the units (heads, or key/value groups); their rows recorded. Returns the
    unit of each query row."""
    heads, kv, d = found.heads, found.kv_heads, found.head_dim
    per = heads // kv
    gqa = tr.options.get("gqa", "query")
    if gqa == "auto":
        gqa = "group" if any(_masked_rows(found.k, g * d, d) for g in range(kv)) else "query"
    if per == 1 or gqa == "group":
        units = tr.new_ids(kv)
        q_unit = units.repeat_interleave(per)
        _rows(tr, found.k, units.repeat_interleave(d))
        _rows(tr, found.v, units.repeat_interleave(d))
    else:  # query heads, the same count from every key/value group
        units = q_unit = tr.new_ids(heads)
        tr.blocks.extend(units[g * per : (g + 1) * per].tolist() for g in range(kv))
    tr.heads.update(units.tolist())
    q_ids = q_unit.repeat_interleave(d)
    _rows(tr, found.q, q_ids)
    kv_unit = units if per == 1 or gqa == "group" else None
    for f in found.follows:
        unit = q_unit if f.side == "q" else kv_unit
        if unit is not None:
            ids = unit if f.per_head else unit.repeat_interleave(d)
            tr.record(tr.owner(getattr(f.module, f.weight)), 0, "norm", torch.arange(len(ids)),
                      ids, op="normalize" if f.whole else "")  # fmt: skip
    return q_ids


def _masked_rows(proj: Proj, start: int, count: int) -> bool:
    """Whether rows start..start+count of the projection are masked whole."""
    mask = proj.module._buffers.get(proj.weight + "_mask")
    if mask is None:
        return False
    return not bool(mask.narrow(proj.out_dim, proj.offset + start, count).any())


def _rows(tr: Tracer, proj: Proj, ids: Tensor) -> None:
    """Rows of a projection (and its bias) owned by `ids`."""
    positions = proj.offset + torch.arange(len(ids))
    tr.record(tr.owner(getattr(proj.module, proj.weight)), proj.out_dim, "out", positions, ids,
              op=proj.op)  # fmt: skip
    bias = getattr(proj.module, proj.bias, None) if proj.bias else None
    start = proj.offset if proj.bias_offset is None else proj.bias_offset
    if start != proj.offset:
        positions = start + torch.arange(len(ids))
    tr.record(tr.owner(bias), 0, "bias", positions, ids)  # the same positions: built once


def _channels(tr: Tracer, x: Any, where: str) -> Tensor | None:
    if not isinstance(x, Tensor):
        return None
    return channel_ids(tr, tr.label(x), x.dim() - 1, x.shape[-1], where)


def _columns(tr: Tracer, projs: tuple[Proj, ...], chans: list[Tensor | None], where: str) -> None:
    """The input columns of the projections; a fused weight read by several inputs (MHA's
    in_proj_weight) ties their channels."""
    done: dict[tuple[int, str], Tensor] = {}
    for proj, chan in zip(projs, chans, strict=False):
        if chan is None:
            continue
        key = (id(proj.module), proj.weight)
        if key in done:
            before = done[key]
            if bool(((before >= 0) != (chan >= 0)).any()):
                tr.block(torch.cat([before, chan]), f"{where}: its fused projection reads "
                         "them beside values of no channel")  # fmt: skip
            tr.merge(before, chan)
            continue
        done[key] = chan
        weight = getattr(proj.module, proj.weight)
        positions = torch.arange(len(chan))
        tr.record(tr.owner(weight), 1 - proj.out_dim, "in", positions, chan, positions,
                  op=proj.op)  # fmt: skip


def update_modules(model: nn.Module) -> None:
    """After compaction: head counts and widths of every attention module and MLP it knows."""
    for module in model.modules():
        adapter = adapter_of(module)
        if adapter is not None:
            adapter.sync(module)
        gate, down = getattr(module, "gate_proj", None), getattr(module, "down_proj", None)
        if isinstance(gate, nn.Linear) and isinstance(down, nn.Linear):  # a LLaMA-style MLP
            _set(module, intermediate_size=gate.out_features, hidden_size=gate.in_features)
        stem = getattr(module, "conv_proj", None)
        if type(module).__name__ == "VisionTransformer" and isinstance(stem, nn.Conv2d):
            _set(module, hidden_dim=stem.out_channels)  # torchvision's ViT reshapes by it
        attention = getattr(module, "self_attention", None)
        if isinstance(attention, nn.MultiheadAttention):  # torchvision's EncoderBlock
            _set(module, num_heads=attention.num_heads)


def is_attention(module: nn.Module) -> bool:
    """Whether an adapter knows `module` (it is then traced whole)."""
    return adapter_of(module) is not None


# an attention module an adapter knows, traced whole (in the module handlers of
# ``structure.graph.tables``)
ATTENTION_HANDLER = ModuleHandler("attention", is_attention, _trace, blind=True)
