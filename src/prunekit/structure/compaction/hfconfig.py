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


Part = tuple[Any, list[tuple[str, nn.Module]]]


def _parts(model: nn.Module) -> list[Part]:
    """Each config of the model with the modules it describes, the model's own first: a
    module belongs to the config of the nearest module above it (itself included) that has
    one, so the vision or audio encoder of a multimodal model, or the language model of a
    composite one, with a config of its own, is described by that config alone."""
    parts: dict[int, Part] = {}
    stack: list[tuple[str, Any]] = []
    for name, module in model.named_modules():
        while stack and stack[-1][0] and not name.startswith(stack[-1][0] + "."):
            stack.pop()
        config = getattr(module, "config", None)
        if hasattr(config, "to_dict") and (not stack or stack[-1][1] is not config):
            stack.append((name, config))
        if stack:
            owner = stack[-1][1]
            parts.setdefault(id(owner), (owner, []))[1].append((name, module))
    return list(parts.values())


def _widths(modules: list[tuple[str, nn.Module]]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {"heads": [], "kv": [], "head_dim": [], "hidden": [],
                                   "inner": [], "shared": []}  # fmt: skip
    found.update(expert_widths(m for _, m in modules))
    for name, module in modules:
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
    """Set the config fields the compacted widths give; return them and the stale fields.

    Each config takes the widths of the modules it describes (see _parts); the fields of a
    part's own config are named with the attribute of the model's config that holds it
    (``vision_config.hidden_size``)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return {}, ()
    updated: dict[str, int] = {}
    stale: list[str] = []
    mine: dict[str, list[int]] = {}
    for part, modules in _parts(model):
        widths = _widths(modules)
        prefix = "" if part is config else _held_as(config, part)
        if prefix is None:
            continue  # a config the model's config does not hold: no file writes it
        found, left = _update_part(part, widths, own=part is config)
        updated.update({prefix + k: v for k, v in found.items()})
        stale += [prefix + k for k in left]
        if part is config:
            mine = widths
    if mine:
        _head_size(model, config, mine, getattr(config, "model_type", ""), updated, stale)
    return updated, tuple(stale)


def _held_as(config: Any, part: Any) -> str | None:
    """The attribute of `config` holding the sub-config `part`, as a prefix ('vision_config.')."""
    for name, value in dict[str, Any](vars(config)).items():
        if value is part:
            return f"{name}."
    return None


def _update_part(
    config: Any, widths: dict[str, list[int]], own: bool
) -> tuple[dict[str, int], list[str]]:
    """Set the fields of one config from the widths of its modules (a part's config only
    the fields it has); return those set and those stale."""
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
        if not own and not hasattr(config, name):
            continue
        if len(values) == 1:
            value = values.pop()
            if getattr(config, name, None) != value:
                setattr(config, name, value)
                updated[name] = value
        elif len(values) > 1:
            stale.append(name)
    return updated, stale


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
