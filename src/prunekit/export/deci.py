"""``export(model, path, "deci")``: a DeciLM folder (``block_configs``), which vLLM serves as
``DeciLMForCausalLM`` (its nemotron_nas model) and llama.cpp's ``convert_hf_to_gguf.py``
converts to its ``deci`` architecture, for a Llama-family causal LM whose layers differ.

What the readers derive from a block (vLLM's ``DeciLMDecoderLayer`` and llama.cpp's
``DeciModel``, read in their sources):

- query heads: ``num_attention_heads``, the same in every layer; llama.cpp takes the head
  width as ``hidden_size // num_attention_heads`` (vLLM takes ``head_dim``), so the query
  heads must still fill the hidden width;
- key/value heads: ``num_attention_heads // attention.n_heads_in_group``;
- MLP width: ``ffn.ffn_mult`` gives ``int(2 * ffn_mult * hidden_size / 3)`` rounded up to a
  multiple of 256. A width w that is a multiple of 256 is reproduced by
  ``ffn_mult = 3 * w / (2 * hidden_size)``: in exact arithmetic the product is w, and a float
  that falls just short of w is rounded up to w again (the next multiple of 256 is w); a width
  that is not a multiple of 256 is not reachable at all. llama.cpp requires ``ffn_mult`` to be
  a float, which it is.

Removed blocks are simply absent (``remove_blocks`` deletes and renumbers them). Everything
else is refused before writing, naming the layer and what would fit (``round_to=256``,
``Budget(kinds=("channels",))``, format "hf"). The weights keep the Llama names both readers
map. There is no stock transformers class for DeciLM, so the check after writing is of the
config (each layer's widths derived back by the readers' rules) and of the weights (read back:
names, shapes and values); no logits are compared.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunekit._extras import require
from prunekit.core.errors import type_error, value_error
from prunekit.export.hf_folder import save_weights, tensor_type
from prunekit.export.layer_widths import LLAMA_FAMILY, DecoderLayer, decoder_layers
from prunekit.export.request import ExportReport, Request
from prunekit.export.tokenizer_files import (
    check_model,
    check_source,
    clear,
    dequantized,
    write_companions,
)

__all__ = ["CONFIG_FILE", "ROUND", "block_configs", "derived_widths", "ffn_mult", "write"]

ROUND = 256  # the readers round an MLP width derived from ffn_mult up to a multiple of this
CONFIG_FILE = "configuration_decilm.py"


def intermediate_size(mult: float, hidden: int) -> int:
    """The MLP width the readers derive from `mult` for a hidden width `hidden`."""
    width = int(2 * mult * hidden / 3)
    return width if width % ROUND == 0 else width + ROUND - width % ROUND


def ffn_mult(width: int, hidden: int) -> float | None:
    """The ``ffn_mult`` from which the readers derive `width` (None: none does)."""
    if width <= 0 or width % ROUND:
        return None
    exact = 3 * width / (2 * hidden)
    for mult in (exact, math.nextafter(exact, math.inf), math.nextafter(exact, 0.0)):
        if intermediate_size(mult, hidden) == width:
            return mult
    return None


def derived_widths(config: dict[str, Any]) -> list[DecoderLayer]:
    """Each layer's widths as the readers derive them from a written config.json."""
    heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    return [
        DecoderLayer(
            heads=heads,
            kv_heads=heads // int(block["attention"]["n_heads_in_group"]),
            head_dim=hidden // heads,
            ffn=intermediate_size(float(block["ffn"]["ffn_mult"]), hidden),
        )
        for block in config["block_configs"]
    ]


def block_configs(model: nn.Module) -> list[dict[str, Any]]:
    """The ``block_configs`` of `model`, one a decoder layer.

    Args:
        model: a compacted causal LM of the Llama family.

    Returns:
        One dict a layer (``attention``: ``n_heads_in_group``; ``ffn``: ``ffn_mult``).

    Raises:
        TypeError: not a causal LM of the Llama family.
        ValueError: a layer the format cannot state (the message names it and what fits).
    """
    config: Any = getattr(model, "config", None)
    kind, name = getattr(config, "model_type", None), type(model).__name__
    if kind not in LLAMA_FAMILY or not name.endswith("ForCausalLM"):
        raise type_error(
            f"export: model is a {name} (model_type {kind!r}); the deci format writes causal "
            f"LMs of the Llama family ({', '.join(LLAMA_FAMILY)}); use format='hf'"
        )
    _refuse_features(model, config)
    layers = decoder_layers(model)
    hidden, first = int(config.hidden_size), layers[0]
    blocks = []
    for index, layer in enumerate(layers):
        where = f"model.layers.{index}"
        if layer.heads != first.heads or layer.heads * layer.head_dim != hidden:
            raise value_error(
                f"export: {where}.self_attn has {layer.heads} query heads of {layer.head_dim} "
                f"(model.layers.0: {first.heads}) for a hidden width of {hidden}; DeciLM "
                "states one count of query heads for all layers, filling the hidden width: "
                "prune with Budget(kinds=('channels',)) (or heads=0), which keeps every query "
                "head, or use format='hf'"
            )
        mult = ffn_mult(layer.ffn, hidden)
        if mult is None:
            raise value_error(
                f"export: {where}.mlp is {layer.ffn} wide; DeciLM's readers derive MLP widths "
                f"from ffn_mult rounded up to a multiple of {ROUND}: prune with "
                f"prune_channels(..., round_to={ROUND}), or use format='hf'"
            )
        blocks.append({
            "attention": {"no_op": False, "replace_with_linear": False, "sparsify": None,
                          "n_heads_in_group": layer.heads // layer.kv_heads},
            "ffn": {"no_op": False, "replace_with_linear": False, "sparsify": None,
                    "ffn_mult": mult},
        })  # fmt: skip
    return blocks


def _refuse_features(model: nn.Module, config: Any) -> None:
    """Refuse what a DeciLM block has no place for: biases, q/k norms, sliding windows and
    an activation other than SiLU."""
    layers: Any = getattr(getattr(model, "model", model), "layers", [])
    for index, layer in enumerate(layers):
        where = f"model.layers.{index}"
        if hasattr(layer.self_attn, "q_norm"):
            raise value_error(
                f"export: {where}.self_attn has per-head q/k norms (model_type "
                f"{config.model_type!r}); DeciLM's blocks have none: use format='hf'"
            )
        for part in (layer.self_attn, layer.mlp):
            for proj_name, proj in part.named_children():
                if isinstance(proj, nn.Linear) and proj.bias is not None:
                    raise value_error(
                        f"export: {where}.{proj_name} has a bias; the deci format writes "
                        "Llama blocks, without biases: use format='hf'"
                    )
    types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    if "sliding_attention" in types or (config.model_type == "mistral" and window is not None):
        raise value_error(
            f"export: model.config.sliding_window={window!r}; DeciLM attends over the whole "
            "context: use format='hf' (or set sliding_window=None if the model never uses it)"
        )
    if getattr(config, "hidden_act", "silu") != "silu":
        raise value_error(
            f"export: model.config.hidden_act={config.hidden_act!r}; DeciLM's readers use "
            "'silu': use format='hf'"
        )


def deci_config(
    model: nn.Module, blocks: list[dict[str, Any]], dtype: str | None
) -> dict[str, Any]:
    """The written config.json: the model's config with the DeciLM fields."""
    config: Any = getattr(model, "config")  # noqa: B009
    values: dict[str, Any] = config.to_dict()
    widths = decoder_layers(model)
    for key in ("auto_map", "layer_types", "sliding_window", "use_sliding_window"):
        values.pop(key, None)
    rope = values.get("rope_parameters") or {}
    values.update(
        architectures=["DeciLMForCausalLM"],
        model_type="nemotron-nas",
        auto_map={"AutoConfig": f"{Path(CONFIG_FILE).stem}.DeciLMConfig"},
        block_configs=blocks,
        num_hidden_layers=len(blocks),
        num_attention_heads=widths[0].heads,
        num_key_value_heads=widths[0].kv_heads,
        head_dim=widths[0].head_dim,
        intermediate_size=max(w.ffn for w in widths),
    )
    if "rope_theta" in rope:  # readers older than rope_parameters read it here
        values["rope_theta"] = rope["rope_theta"]
    if dtype is not None:
        values["dtype"] = dtype
    return values


def write(model: nn.Module, target: Path, request: Request) -> ExportReport:
    """Write `model` as a DeciLM folder into `target` and check it (see the module).

    Args:
        model: a compacted causal LM of the Llama family.
        target: the staged folder to write (its present files are unlinked first).
        request: the export's checked arguments.

    Returns:
        The files written and notes; ``difference`` is None (no logits are compared).

    Raises:
        TypeError: not a Hugging Face causal LM of the Llama family.
        ValueError: masks still held, a layer the format cannot state, a bad `source` or
            `dtype`; raised before anything is written.
        RuntimeError: the written folder does not derive the model's widths or shapes.
    """
    check_model(model, "export")
    with dequantized(model):
        return _write(model, target, request)


def _write(model: nn.Module, target: Path, request: Request) -> ExportReport:
    source = check_source(request.source)
    dtype = tensor_type(request.dtype)
    blocks = block_configs(model)
    values = deci_config(model, blocks, request.dtype)
    clear(target)
    save_weights(model, target, dtype)
    notes = write_companions(model, target, source)
    (target / "config.json").write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(Path(__file__).with_name("remote_deci.py"), target / CONFIG_FILE)
    checker = None
    if request.verify:
        check_folder(model, target, dtype)
        checker = ("block_configs derived by vLLM's and llama.cpp's rules; weights read back "
                   "with safetensors (names, shapes, values)")  # fmt: skip
    notes.append("no stock transformers class runs DeciLM: checked are the derived widths "
                 "and the weights, not logits; vLLM reads the config with "
                 "trust_remote_code=True")  # fmt: skip
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    return ExportReport("deci", request.path, tuple(files), checker, None, tuple(notes))


def check_folder(model: nn.Module, folder: Path, dtype: torch.dtype | None) -> None:
    """Check that the folder's config derives the model's widths and its weights are the
    model's, under the names and shapes the blocks give.

    Raises:
        RuntimeError: they are not.
    """
    values = json.loads((folder / "config.json").read_text())
    derived, actual = derived_widths(values), decoder_layers(model)
    if derived != actual:
        raise RuntimeError(
            f"export: the written block_configs derive {derived}, not the model's {actual}; "
            "nothing was written"
        )
    found = _read_weights(folder)
    hidden = int(values["hidden_size"])
    for index, layer in enumerate(derived):
        q, kv = layer.heads * layer.head_dim, layer.kv_heads * layer.head_dim
        expected = {"self_attn.q_proj": (q, hidden), "self_attn.k_proj": (kv, hidden),
                    "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, q),
                    "mlp.gate_proj": (layer.ffn, hidden), "mlp.up_proj": (layer.ffn, hidden),
                    "mlp.down_proj": (hidden, layer.ffn)}  # fmt: skip
        for name, shape in expected.items():
            key = f"model.layers.{index}.{name}.weight"
            if key not in found or tuple(found[key].shape) != shape:
                got = tuple(found[key].shape) if key in found else "missing"
                raise RuntimeError(f"export: {key} is {got}, not {shape}; nothing was written")
    state = model.state_dict()
    for key, tensor in found.items():
        want = state[key].to(dtype) if dtype is not None else state[key]
        if not torch.equal(tensor, want.to(tensor.dtype)):
            raise RuntimeError(f"export: {key} was written with other values; nothing was written")


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    reader: Any = require("safetensors.torch", "hf", "export: reading the written weights")
    found: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        found.update(reader.load_file(str(path)))
    return found
