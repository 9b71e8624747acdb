"""The widths of each decoder layer of a Llama-family model, read off its modules.

After ``compact`` every layer may have its own widths: query heads, key/value heads and MLP
width. The exporters describe them from here, one record a layer, so that a Hugging Face
config, DeciLM's ``block_configs`` and GGUF's per-layer arrays all say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from prunekit.core.errors import type_error, value_error

__all__ = ["LLAMA_FAMILY", "DecoderLayer", "decoder_layers", "uniform"]

# config.model_type of the families whose decoder layer is Llama's: pre-norm attention with
# q/k/v/o projections (Qwen3 adds per-head q/k norms) and a gated MLP (gate, up, down).
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class DecoderLayer:
    """One decoder layer's widths.

    Attributes:
        heads: query heads.
        kv_heads: key/value heads (``heads`` is a multiple of it).
        head_dim: the width of one head.
        ffn: the MLP's inner width (rows of ``gate_proj``).
    """

    heads: int
    kv_heads: int
    head_dim: int
    ffn: int


def decoder_layers(model: nn.Module) -> list[DecoderLayer]:
    """The widths of every decoder layer of a Llama-family causal LM, in order.

    Args:
        model: a Hugging Face model of the Llama family (``config.model_type`` in
            ``LLAMA_FAMILY``), compacted or not.

    Returns:
        One record a layer.

    Raises:
        TypeError: `model` is not a Hugging Face model of the Llama family.
        ValueError: a layer's projections do not fit together (heads not whole, key/value
            heads that do not divide the query heads).
    """
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in LLAMA_FAMILY:
        raise type_error(
            f"decoder_layers: model has config.model_type {kind!r}; expected a Hugging Face "
            f"model of the Llama family ({', '.join(LLAMA_FAMILY)})"
        )
    base: Any = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise type_error("decoder_layers: model has no ModuleList model.layers of decoder layers")
    return [_layer(f"model.layers.{i}", layer) for i, layer in enumerate(layers)]


def _layer(path: str, layer: Any) -> DecoderLayer:
    attn, mlp = layer.self_attn, layer.mlp
    d = int(attn.head_dim)
    q, k = attn.q_proj.out_features, attn.k_proj.out_features
    if d < 1 or q % d or k % d or k == 0 or (q // d) % (k // d):
        raise value_error(
            f"decoder_layers: {path}.self_attn has {q} query rows and {k} key rows for a "
            f"head_dim of {d}; expected whole heads, the key/value heads dividing the query heads"
        )
    return DecoderLayer(heads=q // d, kv_heads=k // d, head_dim=d, ffn=mlp.gate_proj.out_features)


def uniform(layers: list[DecoderLayer]) -> bool:
    """Whether every layer has the widths of the first (a stock config can say them)."""
    return all(layer == layers[0] for layer in layers)
