"""The fields of a Hugging Face config that depend on layer positions, rewritten for the
layers ``remove_blocks`` keeps (or refused, naming the field, where no rewrite is exact).

A config describes each layer by its index: one entry per layer (``layer_types``,
``mlp_layer_types``, per-layer sliding windows, rope or no-rope flags, a string with one
character per layer, a list repeated over the layers), lists of layer indices
(``mlp_only_layers``, ``moe_layers``), counts of leading or trailing layers
(``max_window_layers``, ``first_k_dense_replace``, ``num_kv_shared_layers``) and step rules
(``decoder_sparse_step``: every k-th layer sparse; ``moe_layer_freq``; Jamba's periods and
offsets). When layers go, each kept layer must keep
its kind: per-layer entries keep the kept ones, index lists are renumbered, counts count
the kept layers among theirs, and a step rule is kept where it still gives every kept
layer its kind, else it becomes an explicit list where the family has one
(``decoder_sparse_step`` with ``mlp_only_layers``), else the removal is refused naming the
field. ``remove_blocks`` then checks the result: a model built from the rewritten config
must build each kept layer as the old config built it (``depth.rebuild``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

from prunekit.core.errors import value_error

__all__ = ["INDEX_LISTS", "layer_config", "position_fields", "rewrite"]

INDEX_LISTS = (
    "mlp_only_layers",
    "moe_layers",
    "attn_layer_indices",
    "full_attn_idxs",
    "local_layer_ids",
    "hybrid_layer_ids",
    "global_attn_layers",
    "rope_scaling_layers",
    "swa_layers",
)
"""Fields holding the indices of some layers."""

_PREFIX_COUNTS = ("max_window_layers", "first_k_dense_replace")
"""Fields counting leading layers (those below the count are of one kind)."""

_SUFFIX_COUNTS = ("num_kv_shared_layers",)
"""Fields counting trailing layers."""

_PER_LAYER_STRINGS = ("hybrid_override_pattern",)
"""Strings with one character per layer."""

_CYCLES = ("block_types",)
"""Lists repeated over the layers (RecurrentGemma's ``block_types``: layer i is of kind
``block_types[i % len(block_types)]``): written out for the kept layers, which repeats
them exactly."""

_POSITIONAL = (
    "layer", "window", "step", "freq", "pattern", "replace", "interval", "period", "offset",
    "idx", "ids", "sparse", "dense", "types",
)  # fmt: skip
"""Words in the names of config fields that may depend on layer positions."""


def layer_config(config: Any, count: int) -> Any:
    """The config (`config` itself or one of its sub-configs, such as ``text_config``) whose
    ``num_hidden_layers`` is `count`; None if none is."""
    if config is None:
        return None
    if getattr(config, "num_hidden_layers", None) == count:
        return config
    for value in vars(config).values():
        if callable(getattr(value, "to_dict", None)) and getattr(
            value, "num_hidden_layers", None
        ) == count:  # fmt: skip
            return value
    return None


def position_fields(config: Any) -> list[str]:
    """``name=value`` of each field of `config` whose name suggests it depends on layer
    positions (for messages)."""
    found = []
    for key, value in vars(config).items():
        if key.startswith("_") or key == "num_hidden_layers":
            continue
        if any(word in key for word in _POSITIONAL) and isinstance(
            value, int | str | list | tuple
        ):  # fmt: skip
            text = repr(value)
            found.append(f"{key}={text if len(text) <= 40 else text[:37] + '...'}")
    return found


def rewrite(config: Any, count: int, kept: list[int]) -> dict[str, Any]:
    """The new values of `config`'s positional fields for the `kept` layers of `count`
    (not set: the caller sets them, in its transaction). Refused (ValueError naming the
    field) where no value expresses the kept layers' kinds."""
    values = vars(config)
    changed: dict[str, Any] = {}
    new_index = {old: new for new, old in enumerate(kept)}
    for key, value in values.items():
        if key.startswith("_") or key == "num_hidden_layers":
            continue
        if key in INDEX_LISTS and _indices(value, count):
            changed[key] = type(value)(new_index[i] for i in value if i in new_index)
        elif isinstance(value, list | tuple) and len(value) == count and _per_layer(key):
            changed[key] = type(value)(value[i] for i in kept)
        elif key in _PER_LAYER_STRINGS and isinstance(value, str) and len(value) == count:
            changed[key] = "".join(value[i] for i in kept)
        elif key in _CYCLES and isinstance(value, list | tuple) and value:
            changed[key] = type(value)(value[i % len(value)] for i in kept)
        elif key in _PREFIX_COUNTS and _is_int(value):
            changed[key] = sum(1 for i in kept if i < value)
        elif key in _SUFFIX_COUNTS and _is_int(value):
            changed[key] = sum(1 for i in kept if i >= count - value)
    changed.update(_sparse_step(values, changed, count, kept))
    _check_rule(values, changed, count, kept, "moe_layer_freq", _moe_freq)
    _check_rule(values, changed, count, kept, "attn_layer_period", _period("attn"))
    _check_rule(values, changed, count, kept, "expert_layer_period", _period("expert"))
    changed["num_hidden_layers"] = len(kept)
    return changed


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _per_layer(key: str) -> bool:
    """Whether a list field with one entry per layer may be one entry per layer: token ids
    and a rope's sections across the head size are not."""
    return "token" not in key and key not in ("architectures", "mrope_section")


def _indices(value: Any, count: int) -> bool:
    return isinstance(value, list | tuple) and all(_is_int(i) and 0 <= i < count for i in value)


def _sparse_step(values: dict[str, Any], changed: dict[str, Any], count: int,
                 kept: list[int]) -> dict[str, Any]:  # fmt: skip
    """Qwen-MoE's rule: layer i is sparse where i is not in ``mlp_only_layers`` and
    ``(i + 1) % decoder_sparse_step == 0``. Kept where it still holds for the kept layers,
    else made explicit: step 1 and every kept dense layer in ``mlp_only_layers``."""
    step = values.get("decoder_sparse_step")
    if not _is_int(step) or step < 1:
        return {}
    only = values.get("mlp_only_layers") or []
    if not _indices(only, count):
        return {}

    def sparse(i: int, rule: int, dense: Any) -> bool:
        return i not in dense and (i + 1) % rule == 0

    wanted = [sparse(i, step, only) for i in kept]
    renumbered = changed.get("mlp_only_layers", [])
    if all(sparse(j, step, renumbered) == w for j, w in enumerate(wanted)):
        return {}
    dense = [j for j, w in enumerate(wanted) if not w]
    if "mlp_only_layers" not in values:
        raise value_error(
            f"remove_blocks: the config's decoder_sparse_step={step} would make other layers "
            "sparse once the blocks are gone, and the config has no mlp_only_layers to list "
            "the dense ones; expected other blocks to remove"
        )
    return {"decoder_sparse_step": 1, "mlp_only_layers": type(only)(dense) if only else dense}


Rule = Callable[[dict[str, Any], int], bool | None]


def _check_rule(values: dict[str, Any], changed: dict[str, Any], count: int, kept: list[int],
                field: str, kind: Rule) -> None:  # fmt: skip
    """Refuse where a step rule (`kind` of a layer under the config's values; None: no
    such rule) would give a kept layer another kind under the rewritten values."""
    if kind(values, 0) is None:
        return
    after = {**values, **changed}
    wrong = [j for j, i in enumerate(kept) if kind(after, j) != kind(values, i)]
    if wrong:
        raise value_error(
            f"remove_blocks: the config's {field}={values[field]!r} gives each layer its kind "
            f"by its position, and no value of it gives kept layer {kept[wrong[0]]} (now "
            f"{wrong[0]}) its kind once the blocks are gone; expected other blocks to remove"
        )


def _moe_freq(values: dict[str, Any], i: int) -> bool | None:
    """DeepSeek's rule: MoE from ``first_k_dense_replace`` on, at every ``moe_layer_freq``."""
    freq, first = values.get("moe_layer_freq"), values.get("first_k_dense_replace", 0)
    if not _is_int(freq) or freq < 1 or not _is_int(first):
        return None
    return i >= first and i % freq == 0


def _period(kind: str) -> Rule:
    """Jamba's rule: layer i is of `kind` where ``i % period == offset``."""

    def rule(values: dict[str, Any], i: int) -> bool | None:
        period, offset = values.get(f"{kind}_layer_period"), values.get(f"{kind}_layer_offset")
        if not _is_int(period) or period < 1 or not _is_int(offset):
            return None
        return i % period == offset

    return rule
