"""Reading a written Hugging Face folder back the way a user without prunekit will.

The folder is loaded by stock transformers in a fresh Python process in which importing
prunekit fails, the example inputs are run through it, and its output is compared with the
in-memory model's: the largest absolute difference over the largest absolute value of the
model's output (NaN, or outputs of different shapes, count as an infinite difference).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.errors import type_error, value_error

__all__ = [
    "check_ids",
    "check_inputs",
    "loaded_output",
    "model_output",
    "rounded_copy",
]

# Run in the fresh process: argv is folder, inputs file, output file, class name, trust flag.
_LOADER = """
import sys
sys.modules["prunekit"] = None  # the folder must load without it
try:
    import prunekit  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("prunekit is importable in the checking process")
import torch, transformers
folder, inputs, out, name, trust = sys.argv[1:6]
loader = getattr(transformers, name)
model = loader.from_pretrained(folder, trust_remote_code=trust == "1", dtype=torch.float32)
model.eval()
batch = torch.load(inputs)
with torch.no_grad():
    found = model(**batch) if isinstance(batch, dict) else model(batch)
logits = getattr(found, "logits", None)
if logits is None:
    logits = getattr(found, "last_hidden_state", None)
if logits is None:
    logits = found if isinstance(found, torch.Tensor) else found[0]
torch.save(logits, out)
"""


def check_inputs(model: nn.Module, inputs: Any) -> Tensor | dict[str, Tensor]:
    """The inputs to compare outputs on: `inputs` checked, or a few token ids by default.

    Raises:
        TypeError: `inputs` is neither None, a tensor nor a dict of tensors.
        ValueError: a tensor that is sparse, on the meta device, empty or not finite, or
            token ids outside the model's vocabulary (see ``check_ids``).
    """
    found = getattr(getattr(model, "config", None), "vocab_size", None)
    known = isinstance(found, int) and found > 0
    vocab = int(found) if known else 2  # type: ignore[arg-type]
    if inputs is None:
        return (torch.arange(1, 9).reshape(1, 8) * 7919 % max(vocab - 1, 1) + 1) % vocab
    if not known:  # no vocabulary to check ids against: any non-negative id
        vocab = 2**62
    takes_ids = getattr(model, "main_input_name", "input_ids") == "input_ids"
    if isinstance(inputs, Tensor):
        if not takes_ids:  # pixel values, features...: values, not ids
            _check_tensor(inputs, "example_inputs")
            return inputs
        return check_ids(inputs, vocab, "example_inputs")
    if isinstance(inputs, dict) and all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in inputs.items()
    ):
        for key, value in inputs.items():
            if key == "input_ids" and takes_ids:
                check_ids(value, vocab, "example_inputs['input_ids']")
            else:
                _check_tensor(value, f"example_inputs[{key!r}]")
        return dict(inputs)
    raise type_error(
        f"export: example_inputs is a {type(inputs).__name__}; expected a tensor of token ids, "
        "a dict of tensors (keyword arguments of the model) or None"
    )


def check_ids(ids: Tensor, vocab: int, where: str) -> Tensor:
    """`ids` checked to be token ids the model can embed: a dense integer tensor on a real
    device, not empty, each in [0, `vocab`).

    Raises:
        ValueError: anything else (the message names `where` and the bad value).
    """
    _check_tensor(ids, where)
    wrong = None
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        wrong = f"of dtype {ids.dtype}"
    elif ids.dim() not in (1, 2):
        wrong = f"of shape {tuple(ids.shape)}"
    elif int(ids.min()) < 0 or int(ids.max()) >= vocab:
        wrong = f"with ids from {int(ids.min())} to {int(ids.max())}"
    if wrong is not None:
        raise value_error(
            f"export: {where} is a tensor {wrong}; expected token ids: integers in "
            f"[0, {vocab}) (the model's vocabulary), of shape (tokens,) or (batch, tokens)"
        )
    return ids


def _check_tensor(value: Tensor, where: str) -> None:
    """Refuse a tensor no model can be run on to compare: sparse, on the meta device,
    empty, or floating with NaN or inf."""
    wrong = None
    if value.layout != torch.strided:
        wrong = f"a {value.layout} tensor"
    elif value.is_meta:
        wrong = "on the meta device (it has no values)"
    elif value.numel() == 0:
        wrong = f"empty (shape {tuple(value.shape)})"
    elif (value.is_floating_point() or value.is_complex()) and not bool(value.isfinite().all()):
        wrong = "holding NaN or inf"
    if wrong is not None:
        raise value_error(
            f"export: {where} is {wrong}; expected a dense tensor of values on which the "
            "written model's outputs are compared with the model's"
        )


def model_output(model: nn.Module, inputs: Tensor | dict[str, Tensor]) -> Tensor:
    """The model's main output on `inputs` (logits, else the last hidden state), in eval
    mode and without gradients; the model's training flag is restored."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            found = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    finally:
        model.train(training)
    return _main_tensor(found).detach().float()


def rounded_copy(model: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """What a folder written in `dtype` (None: each tensor in the model's own type) computes
    once loaded in float32, as the check loads it: `model` itself where it is float32 and
    `dtype` is None, else a float32 copy whose floating parameters are rounded to `dtype`
    first. A float16 or bfloat16 model is compared by its weights computing in float32: its
    own half-precision arithmetic is no output a float32 load reproduces."""
    floating = [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    if dtype is None and all(t.dtype == torch.float32 for t in floating):
        return model
    twin = copy.deepcopy(model)
    with torch.no_grad():
        if dtype is not None:
            for param in twin.parameters():
                if param.is_floating_point():
                    param.copy_(param.to(dtype).to(param.dtype))
        twin.float()
    return twin


def _main_tensor(found: Any) -> Tensor:
    for name in ("logits", "last_hidden_state"):
        value = getattr(found, name, None)
        if isinstance(value, Tensor):
            return value
    if isinstance(found, Tensor):
        return found
    if isinstance(found, (tuple, list)) and found and isinstance(found[0], Tensor):
        return found[0]
    raise TypeError(f"the model's output is a {type(found).__name__}; expected tensors")


def loaded_output(
    folder: Path, loader: str, trust: bool, inputs: Tensor | dict[str, Tensor]
) -> Tensor:
    """The output of the folder loaded by `transformers.<loader>.from_pretrained` in a
    process without prunekit.

    Raises:
        RuntimeError: the folder does not load or run there (the message holds its error).
    """
    with tempfile.TemporaryDirectory(prefix="prunekit-check-") as scratch:
        batch, out = Path(scratch) / "inputs.pt", Path(scratch) / "out.pt"
        torch.save(inputs, batch)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(HF_MODULES_CACHE=str(Path(scratch) / "modules"), HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", _LOADER, str(folder.resolve()), str(batch), str(out), loader,
             "1" if trust else "0"],
            env=env, capture_output=True, text=True, cwd=scratch, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-12:])
            raise RuntimeError(
                f"export: the written folder did not load with transformers.{loader} in a "
                f"process without prunekit; nothing was written. Its error:\n{tail}"
            )
        found: Tensor = torch.load(out)
        return found.float()
