# transformers' classes run an untyped __init_subclass__ when subclassed, and their
# constructors are untyped: typed calls into them are what this file is made of.
# mypy: disable-error-code="no-untyped-call"
"""BERT-style encoders whose layers each have their own widths.

This module is written, as it is, beside the weights of a pruned encoder whose layers differ
(``modeling_pruned.py``), and transformers runs it from there when the folder is loaded with
``trust_remote_code=True``. It imports nothing but torch and transformers.

The config is BERT's own with one list a width, a value a layer: ``layer_intermediate_sizes``
(the feed-forward inner width) and ``layer_num_attention_heads`` (attention heads), and
``attention_head_size``, the width of one head (BERT derives it as hidden_size /
num_attention_heads, which no longer holds once heads are pruned). Each layer is BERT's own
class built from a view of the config with its inner width; its attention projections are
then made as wide as its heads, so the weights load under the stock names. (transformers
5 no longer reads the config's ``pruned_heads``.)
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from transformers.models.bert.modeling_bert import BertLayer


class LayerConfig:
    """One layer's view of its model's config: the widths given, every other field read
    from the model's config when asked."""

    def __init__(self, config: Any, widths: dict[str, int]) -> None:
        self.__dict__["_model_config"] = config
        self.__dict__.update(widths)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_model_config"], name)


def head_size(config: Any) -> int:
    """The width of one attention head."""
    size = getattr(config, "attention_head_size", None)
    return int(size) if size is not None else config.hidden_size // config.num_attention_heads


def build_layer(config: Any, index: int) -> nn.Module:
    """Layer `index` at its own inner width and heads."""
    sizes, heads = config.layer_intermediate_sizes, config.layer_num_attention_heads
    widths = {} if sizes is None else {"intermediate_size": int(sizes[index])}
    layer: Any = BertLayer(LayerConfig(config, widths), layer_idx=index)
    count = config.num_attention_heads if heads is None else int(heads[index])
    size, hidden = head_size(config), config.hidden_size
    attention = layer.attention.self
    attention.query = nn.Linear(hidden, count * size)
    attention.key = nn.Linear(hidden, count * size)
    attention.value = nn.Linear(hidden, count * size)
    attention.num_attention_heads = count
    attention.attention_head_size = size
    attention.all_head_size = count * size
    attention.scaling = size**-0.5
    layer.attention.output.dense = nn.Linear(count * size, hidden)
    return layer  # type: ignore[no-any-return]


def build_encoder(encoder: Any, config: Any) -> None:
    """Give `encoder` its layers, each at its own widths."""
    for field in ("layer_intermediate_sizes", "layer_num_attention_heads"):
        values = getattr(config, field, None)
        if values is not None and len(values) != config.num_hidden_layers:
            raise ValueError(
                f"{field} has {len(values)} entries for {config.num_hidden_layers} layers; "
                "expected one a layer"
            )
    encoder.layer = nn.ModuleList(build_layer(config, i) for i in range(config.num_hidden_layers))


class PrunedBertConfig(BertConfig):
    """A BERT config with a width a layer."""

    model_type = "pruned_bert"
    layer_intermediate_sizes: list[int] | None = None
    layer_num_attention_heads: list[int] | None = None
    attention_head_size: int | None = None


class PrunedBertModel(BertModel):
    """BERT's encoder with a width a layer."""

    config_class = PrunedBertConfig

    def __init__(self, config: PrunedBertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config, add_pooling_layer=add_pooling_layer)
        build_encoder(self.encoder, config)


class PrunedBertForMaskedLM(BertForMaskedLM):
    """BERT's masked LM with a width a layer."""

    config_class = PrunedBertConfig

    def __init__(self, config: PrunedBertConfig) -> None:
        super().__init__(config)
        build_encoder(self.bert.encoder, config)


class PrunedBertForSequenceClassification(BertForSequenceClassification):
    """BERT's sequence classifier with a width a layer."""

    config_class = PrunedBertConfig

    def __init__(self, config: PrunedBertConfig) -> None:
        super().__init__(config)
        build_encoder(self.bert.encoder, config)


class PrunedBertForTokenClassification(BertForTokenClassification):
    """BERT's token classifier with a width a layer."""

    config_class = PrunedBertConfig

    def __init__(self, config: PrunedBertConfig) -> None:
        super().__init__(config)
        build_encoder(self.bert.encoder, config)


class PrunedBertForQuestionAnswering(BertForQuestionAnswering):
    """BERT's question answering head with a width a layer."""

    config_class = PrunedBertConfig

    def __init__(self, config: PrunedBertConfig) -> None:
        super().__init__(config)
        build_encoder(self.bert.encoder, config)
