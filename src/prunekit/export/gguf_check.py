"""Reading a written GGUF file back and comparing it with the model it came from.

Always: ``gguf.GGUFReader`` reads the architecture, the widths (one number, or one a layer
under ``deci``), the token count and every tensor's name, shape and type, and the F32
tensors' values, which must be the model's exactly. Then, where a consumer is installed, the
logits on the example inputs: llama.cpp itself through ``llama_cpp`` (llama-cpp-python) when
it imports; otherwise, for a ``llama`` file without biases or rotary factors, transformers'
GGUF loader (which dequantizes). The largest difference, relative to the largest logit, must
stay within ``BOUNDS`` for the file's type (F32 tight, the others loose: they round).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf as gg
import numpy as np
import torch
from torch import nn

from prunekit.core.difference import relative_difference
from prunekit.core.errors import value_error
from prunekit.export.hfcheck import check_ids, rounded_copy
from prunekit.export.request import Request

if TYPE_CHECKING:
    from prunekit.export.gguf_writer import Plan

__all__ = ["BOUNDS", "check_file", "example_ids"]

# largest relative logit difference accepted for each tensor type, a file's that of the type
# in it that rounds most (the 4- and 5-bit types round most: up to 0.10 and 0.04 on tiny
# random Llamas; a tensor laid out wrong moves them by ~1)
BOUNDS = {"f32": 1e-4, "f16": 5e-2, "bf16": 1e-1, "q8_0": 1e-1, "q5_1": 0.15, "q5_0": 0.15,
          "q4_1": 0.25, "q4_0": 0.25}  # fmt: skip


def check_file(
    target: Path, model: nn.Module, plan: Plan, request: Request
) -> tuple[str | None, float | None, tuple[str, ...]]:
    """Check the file at `target` against `model` and `plan` (see the module's docstring).

    Args:
        target: the written file.
        model: the model it was written from.
        plan: what was meant to be written.
        request: the call (``verify``, ``example_inputs``).

    Returns:
        What checked it, the relative logit difference (None: not compared) and notes.

    Raises:
        RuntimeError: the file differs from the plan, or its logits from the model's.
    """
    if not request.verify:
        return None, None, ("not verified (verify=False)",)
    reader = gg.GGUFReader(target)
    _check_metadata(reader, plan)
    _check_tensors(reader, plan)
    ids = plan.ids
    by, logits = _consumer_logits(target, plan, ids)
    if logits is None:
        return ("gguf.GGUFReader (metadata, tensor names, shapes, types, F32 values)", None,
                (f"logits not compared: {by}",))  # fmt: skip
    with torch.no_grad():  # its weights computing in float32, as the consumers compute
        expected = rounded_copy(model, None)(input_ids=ids).logits.float()
    difference = relative_difference(logits, expected[: logits.shape[0]])
    types = sorted({qtype.name.lower() for _, qtype in plan.tensors.values()})
    bound = max(BOUNDS[name] for name in types)  # the type that rounds most
    if not difference <= bound:
        raise RuntimeError(
            f"export: the GGUF file's logits ({by}) differ from the model's by "
            f"{difference:.3e} relative; expected at most {bound} for tensors of "
            f"{', '.join(types)}"
        )
    return f"gguf.GGUFReader and {by}", difference, ()


def example_ids(inputs: Any, vocab: int) -> torch.Tensor:
    """The token ids to compare logits on: `inputs` (ids, or a mapping with ``input_ids``),
    or a fixed 16 ids drawn from the vocabulary.

    Raises:
        ValueError: `inputs` is not token ids within the vocabulary.
    """
    if inputs is None:
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, vocab, (1, 16), generator=generator)
    ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else inputs
    if not isinstance(ids, torch.Tensor):
        raise value_error(
            f"export: example_inputs is {type(ids).__name__}; expected token ids (an integer "
            f"tensor of shape (tokens,) or (batch, tokens), each below {vocab}) or a mapping "
            f"with 'input_ids'"
        )
    check_ids(ids, vocab, "example_inputs")
    return ids.view(1, -1) if ids.dim() == 1 else ids


def _value(reader: gg.GGUFReader, key: str) -> Any:
    found = reader.get_field(key)
    return None if found is None else found.contents()


def _check_metadata(reader: gg.GGUFReader, plan: Plan) -> None:
    arch = plan.arch
    widths = {
        "feed_forward_length": [layer.ffn for layer in plan.layers],
        "attention.head_count": [layer.heads for layer in plan.layers],
        "attention.head_count_kv": [layer.kv_heads for layer in plan.layers],
    }
    expected: dict[str, Any] = {
        "general.architecture": arch,
        f"{arch}.block_count": len(plan.layers),
        f"{arch}.embedding_length": plan.config["hidden"],
        f"{arch}.attention.key_length": plan.layers[0].head_dim,
        f"{arch}.rope.dimension_count": plan.layers[0].head_dim,
    }
    for key, values in widths.items():
        expected[f"{arch}.{key}"] = values[0] if arch == "llama" else values
    found = {key: _value(reader, key) for key in expected}
    tokens = reader.get_field("tokenizer.ggml.tokens")
    found["tokens"], expected["tokens"] = len(tokens.data) if tokens else 0, plan.config["vocab"]
    wrong = {key: (found[key], value) for key, value in expected.items() if found[key] != value}
    if wrong:
        raise RuntimeError(f"export: the GGUF file read back has {wrong} (found, expected)")


def _check_tensors(reader: gg.GGUFReader, plan: Plan) -> None:
    found = {tensor.name: tensor for tensor in reader.tensors}
    if set(found) != set(plan.tensors):
        raise RuntimeError(
            f"export: the GGUF file read back has tensors {sorted(set(found) ^ set(plan.tensors))} "
            f"where the plan does not, or the reverse"
        )
    for name, (tensor, qtype) in plan.tensors.items():
        got = found[name]
        shape = tuple(int(n) for n in reversed(got.shape.tolist()))
        if got.tensor_type != qtype or shape != tuple(tensor.shape):
            raise RuntimeError(
                f"export: the GGUF file read back has {name} as {got.tensor_type.name} "
                f"{shape}; expected {qtype.name} {tuple(tensor.shape)}"
            )
        if qtype == gg.GGMLQuantizationType.F32 and not np.array_equal(
            np.asarray(got.data).reshape(tensor.shape), tensor.numpy()
        ):
            raise RuntimeError(f"export: the GGUF file read back has other values in {name}")


def _consumer_logits(
    target: Path, plan: Plan, ids: torch.Tensor
) -> tuple[str, torch.Tensor | None]:
    """(what ran it, its logits for the rows of `ids`), or (why nothing ran it, None)."""
    if importlib.util.find_spec("llama_cpp") is not None:
        return "llama.cpp (llama_cpp)", _llama_cpp_logits(target, ids)
    extras = [name for name in plan.tensors if name.endswith(".bias") or name.startswith("rope_")]
    if plan.arch != "llama" or extras:
        why = "a deci file" if plan.arch != "llama" else f"tensors {extras[:3]}"
        return f"llama_cpp is not installed and transformers' GGUF loader cannot read {why}", None
    if importlib.util.find_spec("transformers") is None:
        return "neither llama_cpp nor transformers is installed", None
    return "transformers' GGUF loader", _transformers_logits(target, ids)


def _llama_cpp_logits(target: Path, ids: torch.Tensor) -> torch.Tensor:
    llama_cpp: Any = importlib.import_module("llama_cpp")  # optional: imported where used
    rows = []
    for row in ids.tolist():  # an F32 key/value cache (llama.cpp's default is F16: it rounds)
        runner = llama_cpp.Llama(model_path=str(target), n_ctx=max(32, len(row)), logits_all=True,
                                 type_k=0, type_v=0, verbose=False)  # fmt: skip
        runner.eval(row)
        rows.append(torch.from_numpy(np.array(runner.scores[: len(row)], dtype=np.float32)))
        runner.close()
    return torch.stack(rows)


def _transformers_logits(target: Path, ids: torch.Tensor) -> torch.Tensor:
    # optional dependency, imported where used
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    loaded: Any = AutoModelForCausalLM.from_pretrained(
        str(target.parent), gguf_file=target.name, dtype=torch.float32
    )
    loaded.eval()
    with torch.no_grad():
        logits: torch.Tensor = loaded(input_ids=ids).logits
    return logits
