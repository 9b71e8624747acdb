"""Pruned models written for the places models run: Hugging Face folders, DeciLM
``block_configs``, GGUF files for llama.cpp and ONNX graphs, each checked once written."""

from prunekit.export.api import FORMATS, ExportReport, export
from prunekit.export.layer_widths import DecoderLayer, decoder_layers
from prunekit.export.streamed_shrink import (
    ShrinkStreamedConfig,
    ShrinkStreamedReport,
    shrink_streamed,
)

__all__ = [
    "FORMATS",
    "DecoderLayer",
    "ExportReport",
    "ShrinkStreamedConfig",
    "ShrinkStreamedReport",
    "decoder_layers",
    "export",
    "shrink_streamed",
]
