# transformers' classes run an untyped __init_subclass__ when subclassed, and their
# constructors are untyped: typed calls into them are what this file is made of.
# mypy: disable-error-code="no-untyped-call"
"""Llama-family causal LMs whose decoder layers each have their own widths.

This module is written, as it is, beside the weights of a pruned model whose layers differ
(``modeling_pruned.py``), and transformers runs it from there when the folder is loaded with
``trust_remote_code=True``. It imports nothing but torch and transformers.

The config is the family's own with one list a width, a value a layer:
``layer_intermediate_sizes`` (the MLP's inner width), ``layer_num_attention_heads`` (query
heads) and ``layer_num_key_value_heads`` (key/value heads); ``head_dim`` is one for all
layers. Each decoder layer is the family's own class, built from a view of the config that
gives that layer's widths and reads everything else from the model's config, so the weights
load under the stock names and a generation cache holds each layer's own key/value heads.
The families: Llama (SmolLM too), Mistral, Qwen2 and Qwen3.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    MistralConfig,
    MistralForCausalLM,
    MistralModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2Model,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3Model,
)
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from transformers.models.mistral.modeling_mistral import MistralDecoderLayer
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

# each list of the config and the field of a layer's view it gives
LAYER_FIELDS = {
    "layer_intermediate_sizes": "intermediate_size",
    "layer_num_attention_heads": "num_attention_heads",
    "layer_num_key_value_heads": "num_key_value_heads",
}


class LayerConfig:
    """One decoder layer's view of its model's config: the widths given, every other field
    read from the model's config when asked (so a later change of it, such as the attention
    implementation, reaches every layer)."""

    def __init__(self, config: Any, widths: dict[str, int]) -> None:
        self.__dict__["_model_config"] = config
        self.__dict__.update(widths)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_model_config"], name)


def layer_view(config: Any, index: int) -> LayerConfig:
    """Layer `index`'s view of `config`: its entry of each per-layer list the config has."""
    widths = {}
    for field, name in LAYER_FIELDS.items():
        values = getattr(config, field, None)
        if values is not None:
            widths[name] = int(values[index])
    return LayerConfig(config, widths)


def check_lists(config: Any) -> None:
    """Raise ValueError if a per-layer list of `config` has not one entry a layer."""
    for field in LAYER_FIELDS:
        values = getattr(config, field, None)
        if values is not None and len(values) != config.num_hidden_layers:
            raise ValueError(
                f"{field} has {len(values)} entries for {config.num_hidden_layers} layers; "
                "expected one a layer"
            )


def build_layers(base: nn.Module, config: Any, layer_class: Any) -> None:
    """Give the base model `base` its decoder layers, each at its own widths."""
    check_lists(config)
    base.layers = nn.ModuleList(
        layer_class(layer_view(config, index), index) for index in range(config.num_hidden_layers)
    )


class PrunedLlamaConfig(LlamaConfig):
    """A Llama config with a width a layer."""

    model_type = "pruned_llama"
    layer_intermediate_sizes: list[int] | None = None
    layer_num_attention_heads: list[int] | None = None
    layer_num_key_value_heads: list[int] | None = None


class PrunedLlamaModel(LlamaModel):
    """Llama's base model with a width a layer."""

    config_class = PrunedLlamaConfig

    def __init__(self, config: PrunedLlamaConfig) -> None:
        super().__init__(config)
        build_layers(self, config, LlamaDecoderLayer)


class PrunedLlamaForCausalLM(LlamaForCausalLM):
    """Llama's causal LM with a width a layer."""

    config_class = PrunedLlamaConfig

    def __init__(self, config: PrunedLlamaConfig) -> None:
        super().__init__(config)
        build_layers(self.model, config, LlamaDecoderLayer)


class PrunedMistralConfig(MistralConfig):
    """A Mistral config with a width a layer."""

    model_type = "pruned_mistral"
    layer_intermediate_sizes: list[int] | None = None
    layer_num_attention_heads: list[int] | None = None
    layer_num_key_value_heads: list[int] | None = None


class PrunedMistralModel(MistralModel):
    """Mistral's base model with a width a layer."""

    config_class = PrunedMistralConfig

    def __init__(self, config: PrunedMistralConfig) -> None:
        super().__init__(config)
        build_layers(self, config, MistralDecoderLayer)


class PrunedMistralForCausalLM(MistralForCausalLM):
    """Mistral's causal LM with a width a layer."""

    config_class = PrunedMistralConfig

    def __init__(self, config: PrunedMistralConfig) -> None:
        super().__init__(config)
        build_layers(self.model, config, MistralDecoderLayer)


class PrunedQwen2Config(Qwen2Config):
    """A Qwen2 config with a width a layer."""

    model_type = "pruned_qwen2"
    layer_intermediate_sizes: list[int] | None = None
    layer_num_attention_heads: list[int] | None = None
    layer_num_key_value_heads: list[int] | None = None


class PrunedQwen2Model(Qwen2Model):
    """Qwen2's base model with a width a layer."""

    config_class = PrunedQwen2Config

    def __init__(self, config: PrunedQwen2Config) -> None:
        super().__init__(config)
        build_layers(self, config, Qwen2DecoderLayer)


class PrunedQwen2ForCausalLM(Qwen2ForCausalLM):
    """Qwen2's causal LM with a width a layer."""

    config_class = PrunedQwen2Config

    def __init__(self, config: PrunedQwen2Config) -> None:
        super().__init__(config)
        build_layers(self.model, config, Qwen2DecoderLayer)


class PrunedQwen3Config(Qwen3Config):
    """A Qwen3 config with a width a layer."""

    model_type = "pruned_qwen3"
    layer_intermediate_sizes: list[int] | None = None
    layer_num_attention_heads: list[int] | None = None
    layer_num_key_value_heads: list[int] | None = None


class PrunedQwen3Model(Qwen3Model):
    """Qwen3's base model with a width a layer."""

    config_class = PrunedQwen3Config

    def __init__(self, config: PrunedQwen3Config) -> None:
        super().__init__(config)
        build_layers(self, config, Qwen3DecoderLayer)


class PrunedQwen3ForCausalLM(Qwen3ForCausalLM):
    """Qwen3's causal LM with a width a layer."""

    config_class = PrunedQwen3Config

    def __init__(self, config: PrunedQwen3Config) -> None:
        super().__init__(config)
        build_layers(self.model, config, Qwen3DecoderLayer)
