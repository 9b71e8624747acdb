"""Hugging Face models built from a config: the class and config of a compacted save
(transformers is imported only when a class or config is looked up; what ``from_pretrained``
would build differently from a compacted model is ``compaction.fromconfig``'s).

A compacted model's config holds the widths that are one across layers; the modules hold
the rest. Built anew from that config, a model can differ (per-layer widths, heads cut
while the hidden width is kept: transformers derives the head size as hidden_size /
num_attention_heads, or refuses a hidden_size that does not divide), so ``compact`` warns
and ``load_compacted(folder)`` builds the structure from a config whose head counts divide
every width into the saved head size, then gives each module its saved shapes and the
config its saved fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from prunekit._extras import require

__all__ = ["building_config", "transformers_factory"]

# the config fields that count heads
_HEAD_COUNTS = ("num_attention_heads", "num_key_value_heads", "n_head", "num_heads")


def _transformers() -> Any:
    return require("transformers", "hf", "load_compacted(folder) of a Hugging Face model")


def model_class(root: str, saved: Mapping[str, Any], where: Path) -> type[nn.Module]:
    """The transformers class of the saved model: its own class where transformers defines
    it, else the first of the config's ``architectures`` transformers has."""
    transformers = _transformers()
    names = [root.rsplit(".", 1)[-1]] if root.startswith("transformers.") else []
    architectures = saved.get("architectures")
    if isinstance(architectures, list):
        names += [a for a in architectures if isinstance(a, str)]
    for name in names:
        found = getattr(transformers, name, None)
        if isinstance(found, type) and issubclass(found, nn.Module):
            return found
    raise ValueError(
        f"load_compacted: {where}: transformers {transformers.__version__} has no model class "
        f"for the saved model {root} (config 'architectures': {architectures!r}); expected a "
        "class transformers defines, or load_compacted(folder, factory=lambda config: "
        "Model(config)) with the model's own code"
    )


def building_config(manifest: Mapping[str, Any], where: Path) -> Any:
    """The saved config as a transformers config object, with the head counts that build
    the saved structure: hidden_size / num_attention_heads is then the saved attention
    modules' head size (transformers derives the head size, and the attention scale from
    it, that way, and refuses counts that do not divide), the same for key/value heads.
    load_compacted puts the saved counts back once the model is built."""
    root = manifest["modules"].get("", {}).get("type", "?")
    saved = dict(manifest["config"])
    counts = _building_counts(saved, manifest["modules"])
    try:
        config_class = model_class(root, saved, where).config_class  # type: ignore[attr-defined]
    except (ValueError, AttributeError):
        config_class = _config_class(saved.get("model_type"), where)
    try:
        return config_class.from_dict({**saved, **counts})
    except Exception as error:  # transformers' own checks of the config's values
        raise ValueError(
            f"load_compacted: {where}: {config_class.__name__} refuses the saved config "
            f"({type(error).__name__}: {error}); expected a config transformers builds, or "
            "load_compacted(folder, factory=...) with the model's own code"
        ) from error


def _building_counts(saved: Mapping[str, Any], modules: Mapping[str, Any]) -> dict[str, int]:
    """Head counts giving the saved head size (one across the saved attention modules, as
    their ``head_dim`` or ``attention_head_size``); {} when it is not known."""
    sizes = {
        entry["attributes"][name]
        for entry in modules.values()
        for name in ("head_dim", "attention_head_size")
        if isinstance(entry["attributes"].get(name), int) and entry["attributes"][name] > 0
    }
    hidden = saved.get("hidden_size", saved.get("n_embd", saved.get("d_model")))
    if len(sizes) != 1 or not isinstance(hidden, int) or hidden % (size := sizes.pop()):
        return {}
    names = [n for n in saved if n in _HEAD_COUNTS]
    return {name: hidden // size for name in names if isinstance(saved[name], int)}


def _config_class(kind: Any, where: Path) -> Any:
    transformers = _transformers()
    try:
        return type(transformers.AutoConfig.for_model(kind))
    except (ValueError, KeyError):
        raise ValueError(
            f"load_compacted: {where}: the saved config has model_type={kind!r}, which "
            f"transformers {transformers.__version__} does not know; expected a config "
            "transformers reads"
        ) from None


def transformers_factory(
    root: str, saved: Mapping[str, Any], where: Path
) -> Callable[[Any], nn.Module]:
    """Builds the transformers class of the saved model from the config it is given."""
    cls = model_class(root, saved, where)
    return lambda config: cls(config)
