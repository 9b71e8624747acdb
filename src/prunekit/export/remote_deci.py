# transformers' classes run an untyped __init_subclass__ when subclassed.
# mypy: disable-error-code="no-untyped-call"
"""The config of a DeciLM folder (``model_type`` "nemotron-nas"), read with attribute access.

This module is written, as it is, beside a DeciLM folder's config (``configuration_decilm.py``,
named by ``auto_map``): vLLM's DeciLM model reads ``config.block_configs[i].attention.no_op``,
``.attention.n_heads_in_group``, ``.ffn.no_op`` and ``.ffn.ffn_mult``, so the JSON blocks are
turned into objects here, and back into dicts when the config is saved. It imports nothing
but the standard library and transformers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from transformers import LlamaConfig


@dataclass
class AttentionConfig:
    """A block's attention: key/value heads as query heads per group, or none."""

    no_op: bool = False
    replace_with_linear: bool = False
    n_heads_in_group: int | None = None
    sparsify: list[str] | None = None


@dataclass
class FFNConfig:
    """A block's MLP: its width as ``ffn_mult`` (see the module of the writer), or none."""

    no_op: bool = False
    replace_with_linear: bool = False
    ffn_mult: float | None = None
    sparsify: list[str] | None = None


@dataclass
class BlockConfig:
    """One decoder block."""

    attention: AttentionConfig = field(default_factory=AttentionConfig)
    ffn: FFNConfig = field(default_factory=FFNConfig)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BlockConfig:
        """A block from its JSON dict (keys it does not know are left out)."""
        return cls(
            _part(AttentionConfig, values.get("attention")), _part(FFNConfig, values.get("ffn"))
        )


def _part(kind: Any, values: Any) -> Any:
    if not isinstance(values, dict):
        return kind()
    names = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in values.items() if k in names})


class DeciLMConfig(LlamaConfig):
    """A Llama config whose layers are stated one by one in ``block_configs``."""

    model_type = "nemotron-nas"
    block_configs: list[Any] | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        blocks = self.block_configs or []
        self.block_configs = [b if isinstance(b, BlockConfig) else BlockConfig.from_dict(b)
                              for b in blocks]  # fmt: skip
        super().__post_init__(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON values, its blocks as dicts."""
        values: dict[str, Any] = super().to_dict()
        values["block_configs"] = [
            asdict(b) if isinstance(b, BlockConfig) else b for b in self.block_configs or []
        ]
        return values
