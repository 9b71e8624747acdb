"""``export(model, path, "hf")``: a Hugging Face folder that stock transformers loads with
prunekit not installed.

Where a model built anew from the compacted model's config has its shapes (every layer of the
same widths; ``compact`` sets them in the config), the folder is what ``save_pretrained``
writes: the stock config and the weights (safetensors, sharded when large). Where layers
differ, the config is the family's own with a list a width (``layer_intermediate_sizes``,
``layer_num_attention_heads``, ``layer_num_key_value_heads`` for the Llama family;
``layer_intermediate_sizes``, ``layer_num_attention_heads`` and ``attention_head_size`` for
BERT), and a modeling file beside it (``modeling_pruned.py``, named by ``auto_map``) builds
each layer at its own widths: the folder loads with ``trust_remote_code=True``. Those files
are ``prunekit.export.remote_llama`` and ``remote_bert``, copied as they are; they import
only torch and transformers.

The tokenizer and generation config come from the source (see ``companions``). The folder is
then loaded in a process where prunekit cannot be imported and its outputs on the example
inputs compared with the model's; a relative difference above 1e-5 (or NaN) fails the
export, and nothing is written.
"""

from __future__ import annotations

import importlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunekit._extras import require
from prunekit.core.difference import relative_difference
from prunekit.core.errors import type_error, value_error
from prunekit.export.hfcheck import (
    check_inputs,
    loaded_output,
    model_output,
    rounded_copy,
)
from prunekit.export.layer_widths import decoder_layers
from prunekit.export.request import ExportReport, Request
from prunekit.export.tokenizer_files import (
    check_model,
    check_source,
    clear,
    dequantized,
    write_companions,
)
from prunekit.structure.compaction.fromconfig import build_fresh, difference

__all__ = [
    "DTYPES",
    "MODELING_FILE",
    "TOLERANCE",
    "Plan",
    "plan_folder",
    "save_weights",
    "tensor_type",
    "write",
]

TOLERANCE = 1e-5  # the largest relative difference of the outputs a written folder may have
MODELING_FILE = "modeling_pruned.py"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# config.model_type -> (the modeling module of this package, the family's class prefix)
REMOTE = {
    "llama": ("remote_llama", "Llama"),
    "mistral": ("remote_llama", "Mistral"),
    "qwen2": ("remote_llama", "Qwen2"),
    "qwen3": ("remote_llama", "Qwen3"),
    "bert": ("remote_bert", "Bert"),
}
# the end of a model's class name -> the auto class that loads it
AUTO = {
    "ForCausalLM": "AutoModelForCausalLM",
    "ForMaskedLM": "AutoModelForMaskedLM",
    "ForSequenceClassification": "AutoModelForSequenceClassification",
    "ForTokenClassification": "AutoModelForTokenClassification",
    "ForQuestionAnswering": "AutoModelForQuestionAnswering",
    "Model": "AutoModel",
}


@dataclass(frozen=True)
class Plan:
    """How a model is written as a Hugging Face folder.

    Attributes:
        config: the config to write (the model's own where it is stock).
        loader: the name in ``transformers`` that loads the folder.
        module: the modeling file to write beside the config (None: stock classes).
    """

    config: Any
    loader: str
    module: Path | None


def plan_folder(model: nn.Module) -> Plan:
    """How `model` (compacted) is written: its stock config where a model built from it has
    its shapes, else the family's config with a width a layer and the modeling file.

    Args:
        model: a compacted Hugging Face model.

    Returns:
        The plan.

    Raises:
        TypeError: the model's class is not one of transformers.
        ValueError: the layers differ and the family has no modeling file here, or the
            modeling file cannot build the model's shapes (the message names what differs
            and what is supported).
    """
    config: Any = getattr(model, "config")  # noqa: B009
    name = type(model).__name__
    fresh = build_fresh(model, config)
    why = difference(model, fresh) if isinstance(fresh, nn.Module) else fresh
    if not hasattr(require("transformers", "hf", "export to hf"), name):
        raise type_error(
            f"export: model is a {name}, which is not a class of transformers; the hf format "
            "writes models of transformers' own classes (a folder they load without other code)"
        )
    if why is None:
        return Plan(config, name, None)
    kind = getattr(config, "model_type", None)
    supported = ", ".join(f"{p}* ({k})" for k, (_, p) in REMOTE.items())
    found = REMOTE.get(kind) if isinstance(kind, str) else None
    suffix = name.removeprefix(found[1]) if found is not None and name.startswith(found[1]) \
        else None  # fmt: skip
    if found is None or suffix not in AUTO:
        raise value_error(
            f"export: {name} (model_type {kind!r}) has layers a stock config cannot describe "
            f"({why}); the hf format writes a modeling file for the classes {supported} "
            f"ending in {', '.join(AUTO)}"
        )
    return _remote_plan(model, found[0], f"Pruned{name}", AUTO[suffix])


def _remote_plan(model: nn.Module, module_name: str, class_name: str, loader: str) -> Plan:
    module = importlib.import_module(f"prunekit.export.{module_name}")
    config: Any = getattr(model, "config")  # noqa: B009
    widths = _llama_widths(model) if module_name == "remote_llama" else _bert_widths(model)
    config_class: Any = getattr(module, class_name).config_class
    dropped = ("model_type", "architectures", "auto_map", "transformers_version")
    values = {k: v for k, v in config.to_dict().items() if k not in dropped}
    written = config_class.from_dict({**values, **widths})
    written.architectures = [class_name]
    written.auto_map = {"AutoConfig": f"{Path(MODELING_FILE).stem}.{config_class.__name__}",
                        loader: f"{Path(MODELING_FILE).stem}.{class_name}"}  # fmt: skip
    with torch.device("meta"):
        fresh = getattr(module, class_name)(config_class.from_dict(written.to_dict()))
    why = difference(model, fresh)
    if why is not None:
        raise value_error(
            f"export: {type(model).__name__}'s layers cannot be described by a width a layer "
            f"(a model built so differs: {why}); expected layers that differ only in their "
            "heads and inner widths"
        )
    return Plan(written, loader, Path(str(module.__file__)))


def _llama_widths(model: nn.Module) -> dict[str, Any]:
    layers = decoder_layers(model)
    sizes = {layer.head_dim for layer in layers}
    if len(sizes) > 1:
        raise value_error(
            f"export: the decoder layers have heads of widths {sorted(sizes)}; expected one "
            "head_dim for all layers (the families of the Llama family read one)"
        )
    return {
        "head_dim": layers[0].head_dim,
        "layer_intermediate_sizes": [layer.ffn for layer in layers],
        "layer_num_attention_heads": [layer.heads for layer in layers],
        "layer_num_key_value_heads": [layer.kv_heads for layer in layers],
    }


def _bert_widths(model: nn.Module) -> dict[str, Any]:
    base: Any = getattr(model, "bert", model)
    layers = list(base.encoder.layer)
    sizes = {int(layer.attention.self.attention_head_size) for layer in layers}
    if len(sizes) > 1:
        raise value_error(
            f"export: the encoder layers have heads of widths {sorted(sizes)}; expected one "
            "attention_head_size for all layers"
        )
    size = sizes.pop()
    return {
        "attention_head_size": size,
        "layer_intermediate_sizes": [
            int(layer.intermediate.dense.out_features) for layer in layers
        ],
        "layer_num_attention_heads": [
            int(layer.attention.self.query.out_features) // size for layer in layers
        ],
    }


def tensor_type(name: str | None) -> torch.dtype | None:
    """The tensor type named `name` (None: the model's own).

    Raises:
        ValueError: a name not in ``DTYPES``.
    """
    if name is None or name in DTYPES:
        return None if name is None else DTYPES[name]
    raise value_error(
        f"export: dtype={name!r} is not a tensor type the hf format writes; expected one of "
        f"{', '.join(DTYPES)} or None (the model's own)"
    )


def write(model: nn.Module, target: Path, request: Request) -> ExportReport:
    """Write `model` as a Hugging Face folder into `target` and check it (see the module).

    Args:
        model: a compacted Hugging Face model.
        target: the staged folder to write (its present files are unlinked first).
        request: the export's checked arguments.

    Returns:
        The files written, the difference found and notes.

    Raises:
        TypeError: `model` is not a Hugging Face model; `example_inputs` of a wrong type.
        ValueError: the model still holds masks, a family or shape the format cannot
            describe, a bad `source` or `dtype`; raised before anything is written.
        RuntimeError: the written folder does not load, or its outputs differ from the
            model's by more than ``TOLERANCE``.
    """
    check_model(model, "export")
    with dequantized(model):
        return _write(model, target, request)


def _write(model: nn.Module, target: Path, request: Request) -> ExportReport:
    source = check_source(request.source)
    dtype = tensor_type(request.dtype)
    inputs = check_inputs(model, request.example_inputs)
    plan = plan_folder(model)
    clear(target)
    save_weights(model, target, dtype)
    notes = write_companions(model, target, source)
    if plan.module is not None:
        plan.config.save_pretrained(str(target))
        shutil.copyfile(plan.module, target / MODELING_FILE)
        notes.append(
            f"layers of their own widths: {MODELING_FILE} builds them; load with "
            f"transformers.{plan.loader}.from_pretrained(path, trust_remote_code=True)"
        )
    if dtype is not None:
        _set_dtype(target / "config.json", request.dtype)
    gap, checker = None, None
    if request.verify:
        gap = _check(model, target, plan, inputs, dtype)
        checker = f"transformers {_version()} ({plan.loader}), in a process without prunekit"
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    return ExportReport("hf", request.path, tuple(files), checker, gap, tuple(notes))


def _check(
    model: nn.Module, target: Path, plan: Plan, inputs: Any, dtype: torch.dtype | None
) -> float:
    """The relative difference of the written folder's outputs from the model's.

    Raises:
        RuntimeError: the folder does not load, or the difference is above ``TOLERANCE``.
    """
    reference = rounded_copy(model, dtype)
    expected = model_output(reference, inputs)
    found = loaded_output(target, plan.loader, plan.module is not None, inputs)
    gap = relative_difference(found, expected)
    if not gap <= TOLERANCE:
        raise RuntimeError(
            f"export: the written folder's outputs differ from the model's by {gap:.3g} "
            f"(relative; at most {TOLERANCE:g} allowed); nothing was written"
        )
    return gap


def save_weights(model: nn.Module, target: Path, dtype: torch.dtype | None) -> None:
    """Write the model's weights (and config, generation config) with save_pretrained into
    `target`, converted to `dtype` if given; the model's config is left as it was
    (save_pretrained sets its dtype and architectures)."""
    config: Any = getattr(model, "config")  # noqa: B009
    kept = dict(vars(config))
    state = None
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v
                 for k, v in model.state_dict().items()}  # fmt: skip
    try:
        getattr(model, "save_pretrained")(str(target), state_dict=state)  # noqa: B009
    finally:
        vars(config).clear()
        vars(config).update(kept)


def _set_dtype(path: Path, name: str | None) -> None:
    """State the written tensors' type in config.json (save_pretrained states the model's)."""
    values = json.loads(path.read_text(encoding="utf-8"))
    values["dtype"] = name
    path.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _version() -> str:
    return str(require("transformers", "hf", "export to hf").__version__)
