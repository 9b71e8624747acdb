"""A compacted Hugging Face model's config: the widths its modules now have, where they are
one across layers.

Read off the modules, never from transformers (not imported): the head counts of every
attention module an adapter knows, the width feeding them (the hidden size) and the MLP
widths. A field whose width differs from layer to layer keeps its old value and is reported
stale: the modules carry their own widths, so the model runs, but a model built anew from
that config would not have them.

Then the config is checked the way ``from_pretrained`` will read it
(``prunekit.structure.compaction.fromconfig``). A head size that is no longer hidden_size /
num_attention_heads is first written to ``head_dim`` (most families read it when the config
has it); a width of a field named in the family's own way (ffn_dim, n_embd, ...) is found by
``fromconfig.repair``; whatever a rebuilt model still differs in is reported stale, so
save_compacted is the way to save.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from prunekit.structure.compaction.fromconfig import (
    build_fresh,
    difference,
    fold_embed_scales,
    mismatches,
    repair,
)
from prunekit.structure.families.attention import adapter_of
from prunekit.structure.families.experts import expert_widths

# config.model_type of the families whose attention reads config.head_dim when it is set
_READS_HEAD_DIM = {"llama", "mistral", "qwen2", "vit"}


def _widths(model: nn.Module) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {"heads": [], "kv": [], "head_dim": [], "hidden": [],
                                   "inner": [], "shared": []}  # fmt: skip
    found.update(expert_widths(model))
    for name, module in model.named_modules():
        adapter = adapter_of(module)
        if adapter is not None:
            for key, value in zip(("heads", "kv", "head_dim", "hidden"), adapter.sync(module),
                                  strict=True):  # fmt: skip
                found[key].append(value)
        inner = _inner(module)
        if inner:  # a mixture-of-experts block's shared expert has a width of its own
            shared = name.rsplit(".", 1)[-1] in ("shared_expert", "shared_experts")
            found["shared" if shared else "inner"].append(inner)
    return found


def _inner(module: Any) -> int:
    """The intermediate width of an MLP block of a known family (0: not one)."""
    name = type(module).__name__
    if name.endswith("MLP"):
        fused: Any = getattr(module, "gate_up_proj", None)
        if isinstance(fused, nn.Linear):  # Phi-3: gate and up rows in one Linear
            return fused.out_features // 2
        for proj in ("gate_proj", "fc1", "c_fc"):
            layer: Any = getattr(module, proj, None)
            if isinstance(layer, nn.Linear):
                return layer.out_features
            if isinstance(layer, nn.Module) and type(layer).__name__ == "Conv1D":
                return int(getattr(layer, "weight").shape[1])  # noqa: B009
    if name.endswith("Intermediate") and isinstance(getattr(module, "dense", None), nn.Linear):
        return int(module.dense.out_features)
    return 0


def update_config(model: nn.Module) -> tuple[dict[str, int], tuple[str, ...]]:
    """Set the config fields the compacted widths give; return them and the stale fields."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return {}, ()
    widths = _widths(model)
    kind = getattr(config, "model_type", "")
    fields = [("num_attention_heads", "heads"), ("hidden_size", "hidden")]
    if hasattr(config, "num_key_value_heads"):
        fields.append(("num_key_value_heads", "kv"))
    if hasattr(config, "head_dim") or kind in _READS_HEAD_DIM:
        fields.append(("head_dim", "head_dim"))
    fields.append(("n_inner" if kind == "gpt2" else "intermediate_size", "inner"))
    fields += _expert_fields(config, widths)
    updated: dict[str, int] = {}
    stale: list[str] = []
    for name, key in fields:
        values = set(widths[key])
        if len(values) == 1:
            value = values.pop()
            if getattr(config, name, None) != value:
                setattr(config, name, value)
                updated[name] = value
        elif len(values) > 1:
            stale.append(name)
    _head_size(model, config, widths, kind, updated, stale)
    return updated, tuple(stale)


def _expert_fields(config: Any, widths: dict[str, list[int]]) -> list[tuple[str, str]]:
    """The expert count (under each name the config has) and the experts' inner width:
    moe_intermediate_size where the config has one, else intermediate_size (Mixtral, OLMoE:
    their experts are the only MLPs, so the widths join)."""
    if not widths["experts"] and not widths["expert_inner"]:
        return []
    fields = [(name, "experts") for name in ("num_experts", "num_local_experts", "n_routed_experts")
              if isinstance(getattr(config, name, None), int)]  # fmt: skip
    if hasattr(config, "moe_intermediate_size"):
        fields.append(("moe_intermediate_size", "expert_inner"))
    else:
        widths["inner"] = widths["inner"] + widths["expert_inner"]
    if hasattr(config, "shared_expert_intermediate_size"):
        fields.append(("shared_expert_intermediate_size", "shared"))
    return fields


def _head_size(model: nn.Module, config: Any, widths: dict[str, list[int]], kind: str,
               updated: dict[str, int], stale: list[str]) -> None:  # fmt: skip
    """A family that may derive the head size as hidden_size / num_attention_heads: where
    that no longer holds, head_dim is set if a model built from the config then has the
    compacted shapes; then whatever such a model would still differ in is reported stale."""
    sizes = set(widths["head_dim"])
    if not (kind in _READS_HEAD_DIM or hasattr(config, "head_dim") or len(sizes) != 1):
        (size,) = sizes
        if size * config.num_attention_heads != config.hidden_size:
            without = mismatches(model, config)
            config.head_dim = size
            found = mismatches(model, config)
            if found is not None and (without is None or found < without):
                updated["head_dim"] = size
            else:
                del config.head_dim
    if stale:  # the fields already named say why a rebuilt model differs
        return
    updated.update(repair(model, config))  # fields of a family's own names (ffn_dim, n_embd)
    fresh = build_fresh(model, config)
    if isinstance(fresh, nn.Module):
        fold_embed_scales(model, fresh)
        why = difference(model, fresh)
    else:
        why = None if fresh is None else fresh[:200]
    if why is not None:
        stale.append(f"a model built from the config differs ({why})")
