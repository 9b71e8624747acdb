"""Where the residual stream of a decoder is read and written, found by the module names of
the Llama family (Llama, Mistral, Qwen2, Qwen3): each norm with the linear layers that read
its output, the layers that write into the stream, the embedding and the head."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from prunekit.core.errors import type_error, value_error

OWNER = "rotate_hidden"
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
"""The ``config.model_type`` of the families whose RMSNorm is ``weight * x / rms(x)`` and
whose blocks read and write the stream as Llama's do."""

_READERS = {"input_layernorm": ("self_attn", ("q_proj", "k_proj", "v_proj")),
            "post_attention_layernorm": ("mlp", ("gate_proj", "up_proj"))}  # fmt: skip
_WRITERS = (("self_attn", "o_proj"), ("mlp", "down_proj"))


@dataclass(frozen=True)
class Reading:
    """One norm and the linear layers that read its output."""

    name: str
    norm: nn.Module
    readers: tuple[nn.Linear, ...]


@dataclass(frozen=True)
class Stream:
    """The residual stream of a causal language model: what reads and writes it."""

    embedding: nn.Embedding
    head: nn.Linear
    readings: tuple[Reading, ...]
    writers: tuple[nn.Linear, ...]
    blocks: tuple[nn.Module, ...]

    @property
    def width(self) -> int:
        return int(self.embedding.embedding_dim)

    @property
    def tied(self) -> bool:
        return self.head.weight is self.embedding.weight


def find_stream(model: nn.Module) -> Stream:
    """The residual stream of `model`, a causal LM of the Llama family.

    Raises:
        TypeError: `model` is no nn.Module.
        ValueError: an unsupported family, a missing part, or masks installed.
    """
    if not isinstance(model, nn.Module):
        raise type_error(f"{OWNER}: invalid model of type {type(model).__name__}; expected an "
                         "nn.Module (a causal language model of the Llama family)")  # fmt: skip
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        raise value_error(
            f"{OWNER}: unsupported model {type(model).__name__} (config.model_type={family!r}); "
            f"expected a causal language model of one of the families {list(FAMILIES)}"
        )
    pruned = [n for n, _ in model.named_parameters() if n.endswith("_orig")]
    if pruned:
        raise value_error(
            f"{OWNER}: {type(model).__name__} has masks installed ({pruned[0]}, ...); expected "
            "a model without masks: rotate first, or compact (or remove) the masks"
        )
    base = getattr(model, "model", None)
    parts = {"model.embed_tokens": getattr(base, "embed_tokens", None),
             "model.norm": getattr(base, "norm", None), "lm_head": getattr(model, "lm_head", None),
             "model.layers": getattr(base, "layers", None)}  # fmt: skip
    kinds = {"model.embed_tokens": nn.Embedding, "lm_head": nn.Linear,
             "model.layers": nn.ModuleList, "model.norm": nn.Module}  # fmt: skip
    for name, part in parts.items():
        if not isinstance(part, kinds[name]):
            raise value_error(
                f"{OWNER}: {type(model).__name__} has no {kinds[name].__name__} at {name}; "
                "expected a causal language model with a head (a ...ForCausalLM)"
            )
    blocks = tuple(parts["model.layers"])  # type: ignore[arg-type]
    readings, writers = _block_parts(blocks)
    final = Reading("model.norm", parts["model.norm"], (parts["lm_head"],))  # type: ignore[arg-type]
    stream = Stream(parts["model.embed_tokens"], parts["lm_head"], (*readings, final),  # type: ignore[arg-type]
                    tuple(writers), blocks)  # fmt: skip
    for reading in stream.readings:
        _check_norm(reading, stream.width)
    for linear in stream.writers:
        if linear.out_features != stream.width:
            raise value_error(f"{OWNER}: a layer writing the stream has {linear.out_features} "
                              f"outputs; expected the hidden width {stream.width}")  # fmt: skip
    return stream


def _block_parts(blocks: tuple[nn.Module, ...]) -> tuple[list[Reading], list[nn.Linear]]:
    readings: list[Reading] = []
    writers: list[nn.Linear] = []
    for index, block in enumerate(blocks):
        where = f"model.layers.{index}"
        for norm_name, (parent, names) in _READERS.items():
            found = [_linear(block, where, parent, n) for n in names]
            norm = getattr(block, norm_name, None)
            if not isinstance(norm, nn.Module):
                raise value_error(f"{OWNER}: {where} has no {norm_name}; expected a block of "
                                  "the Llama family")  # fmt: skip
            readings.append(Reading(f"{where}.{norm_name}", norm, tuple(found)))
        writers += [_linear(block, where, parent, name) for parent, name in _WRITERS]
    return readings, writers


def _linear(block: nn.Module, where: str, parent: str, name: str) -> nn.Linear:
    found = getattr(getattr(block, parent, None), name, None)
    if not isinstance(found, nn.Linear):
        raise value_error(
            f"{OWNER}: {where}.{parent}.{name} is {type(found).__name__}, not an nn.Linear; "
            "expected a block of the Llama family (separate projections)"
        )
    return found


def _check_norm(reading: Reading, width: int) -> None:
    weight = getattr(reading.norm, "weight", None)
    shaped = isinstance(weight, nn.Parameter) and tuple(weight.shape) == (width,)
    if not (type(reading.norm).__name__.endswith("RMSNorm") and shaped
            and isinstance(getattr(reading.norm, "variance_epsilon", None), float)):  # fmt: skip
        raise value_error(
            f"{OWNER}: {reading.name} is {type(reading.norm).__name__}; expected an RMSNorm "
            f"with a weight of {width} entries and a float variance_epsilon"
        )
    for linear in reading.readers:
        if linear.in_features != width:
            raise value_error(f"{OWNER}: a reader of {reading.name} takes {linear.in_features} "
                              f"inputs; expected the hidden width {width}")  # fmt: skip
