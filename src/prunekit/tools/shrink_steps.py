"""The stages of ``shrink`` that stand on their own: the text cut into token windows, the
distillation for a given time, and the formats written into the staged output."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from prunekit.core.autocast import fresh_casts
from prunekit.core.checks import refuse_not_finite
from prunekit.core.errors import value_error
from prunekit.export.api import FORMATS, export
from prunekit.io.atomic import overlaps
from prunekit.io.files import CheckpointError
from prunekit.io.text import read_texts, windows
from prunekit.schedule.distill import Distiller
from prunekit.tools.shrink_report import ExportRecord
from prunekit.tools.shrink_source import TOKENIZER_FILES, storage_of

if TYPE_CHECKING:
    from prunekit.tools.shrink import ShrinkConfig

__all__ = [
    "Passages",
    "Texts",
    "distill",
    "export_all",
    "model_files",
    "pydoc_passages",
    "read_passages",
    "text_windows",
]

_SMALLER_LR = "a smaller --lr (lr= of ShrinkConfig)"
# the files of an output that hold a model's weights (what "on disk" counts)
_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".onnx", ".bin", ".data")


@dataclass(frozen=True)
class Texts:
    """The windows of token ids to calibrate on and to measure perplexity on (disjoint), and
    where each came from."""

    calibration: list[Tensor]
    evaluation: list[Tensor]
    names: tuple[str, str]


def pydoc_passages() -> tuple[str, ...]:
    """Python's help topics (``pydoc_data.topics``, in the standard library), by name."""
    from pydoc_data.topics import topics  # noqa: PLC0415  # read only when no text is given

    return tuple(topics[name] for name in sorted(topics))


@dataclass(frozen=True)
class Passages:
    """The text read for calibration and for evaluation (None: held out of calibration's),
    and where each came from."""

    calibration: list[str]
    evaluation: list[str] | None
    names: tuple[str, str]


def read_passages(config: ShrinkConfig) -> Passages:
    """The passages `config` names, read (before the model is: a bad path fails at once).

    Raises:
        CheckpointError: a text path that cannot be read (see ``read_texts``), or that is,
            holds or lies inside the output folder: replaced whole, it would delete the
            text read, or a folder of texts would read an earlier output's report.md.
    """
    for which in ("calibration", "evaluation"):
        given = getattr(config, which)
        if isinstance(given, Path) and overlaps(given, config.out):
            raise CheckpointError(
                f"{given}: the {which} text is, holds or lies inside the output {config.out} "
                "(links resolved); expected text apart from the output, which is replaced "
                "whole (a text inside it would be deleted, an earlier report in it read)"
            )
    calibration, name = _passages(config.calibration, "Python's help topics (pydoc_data)")
    if config.evaluation is None:
        return Passages(calibration, None, (name, f"the held-out end of {name}"))
    evaluation, held_name = _passages(config.evaluation, "")
    return Passages(calibration, evaluation, (name, held_name))


def text_windows(
    config: ShrinkConfig, tokenizer: Any, model: nn.Module, passages: Passages | None = None
) -> Texts:
    """The calibration and evaluation windows `config` asks for, tokenized by `tokenizer`.

    Without evaluation text, the calibration text's last tokens are held out for it (as many
    as asked, at most their share of what there is) and the calibration windows come from
    the tokens before them.

    Raises:
        CheckpointError: a text path that cannot be read (see ``read_texts``).
        ValueError: too little text for one window of each, or windows longer than the
            model's positions.
    """
    most = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(most, int) and config.length > most:
        raise value_error(
            f"shrink: length={config.length} tokens per window; expected at most the model's "
            f"max_position_embeddings ({most})"
        )
    text = read_passages(config) if passages is None else passages
    wanted = config.calibration_tokens + (0 if text.evaluation else config.evaluation_tokens)
    ids = _ids(tokenizer, text.calibration, wanted)
    if text.evaluation is None:
        held = min(config.evaluation_tokens, int(len(ids) * config.evaluation_tokens / wanted))
        evaluation, ids = ids[len(ids) - held :], ids[: len(ids) - held]
    else:
        evaluation = _ids(tokenizer, text.evaluation, config.evaluation_tokens)
    found = Texts(
        windows(ids, config.length, config.calibration_tokens // config.length),
        windows(evaluation, config.length, config.evaluation_tokens // config.length),
        text.names,
    )
    for what, parts, have in (
        ("calibration", found.calibration, len(ids)),
        ("evaluation", found.evaluation, len(evaluation)),
    ):
        if not parts:
            raise value_error(
                f"shrink: the {what} text gives {have} tokens; expected at least one window of "
                f"length={config.length} tokens (more text, or a smaller --length)"
            )
    return found


def _passages(given: Path | tuple[str, ...] | None, default: str) -> tuple[list[str], str]:
    if given is None:
        return list(pydoc_passages()), default
    if isinstance(given, Path):
        return read_texts(given), str(given)
    return list(given), f"{len(given)} passages given"


def _ids(tokenizer: Any, passages: Sequence[str], wanted: int) -> Tensor:
    """The token ids of the passages in order (joined by a blank line), the first `wanted`."""
    found: list[int] = []
    for number, text in enumerate(passages):
        found += tokenizer(("\n\n" if number else "") + text, add_special_tokens=False)["input_ids"]
        if len(found) >= wanted:
            break
    return torch.tensor(found[:wanted], dtype=torch.long)


def distill(
    student: nn.Module,
    teacher: nn.Module,
    parts: list[Tensor],
    config: ShrinkConfig,
    tick: Callable[[str, int, int], None],
) -> tuple[int, float]:
    """Train `student` on `teacher`'s logits (``Distiller``, KL at temperature 1) over
    windows of `parts` drawn at random, for ``config.distill`` seconds; (steps, seconds)."""
    distiller = Distiller(teacher, temperature=1.0)
    trained = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=config.run_lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(config.run_seed)
    seconds = max(int(config.distill), 1)
    student.train()
    started, steps = time.perf_counter(), 0
    with fresh_casts():  # under a caller's autocast: each step reads the weights as they are
        try:
            while (elapsed := time.perf_counter() - started) < config.distill:
                tick("distill", min(int(elapsed), seconds), seconds)
                x = parts[int(torch.randint(len(parts), (1,), generator=generator))][None]
                for group in optimizer.param_groups:  # a short warm-up of the learning rate
                    group["lr"] = config.run_lr * min(1.0, (steps + 1) / 10)
                loss = distiller.loss(student(input_ids=x), {"input_ids": x})
                if not bool(torch.isfinite(loss)):
                    raise value_error(
                        f"shrink: the distillation loss of step {steps} is {float(loss.detach())}; "
                        f"expected a finite loss ({_SMALLER_LR})"
                    )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                torch.nn.utils.clip_grad_norm_(trained, 1.0)
                optimizer.step()
                steps += 1
            if steps:
                refuse_not_finite("shrink", student, trained, "the distillation", _SMALLER_LR)
        finally:
            student.eval()
            optimizer.zero_grad(set_to_none=True)
    tick("distill", seconds, seconds)
    return steps, time.perf_counter() - started


def export_all(
    model: nn.Module,
    tokenizer: Any,
    stage: Path,
    config: ShrinkConfig,
    example: Any,
    types: tuple[torch.dtype, str | None] = (torch.float32, None),
) -> tuple[tuple[ExportRecord, ...], int, str]:
    """Write every format of `config` into `stage`; the records, and the bytes of the first
    format's weight files and how they store their tensors (``sources.storage_of``).

    With one folder format the stage is the model folder; otherwise each folder format goes
    to ``<format>/`` and each file format to ``model.<format>``. A folder gets the tokenizer
    where its writer copied none (a GGUF source's, say). The ONNX graph is traced on the
    example twice over (``batch_of_two``): a Llama's code fixes a batch of one. `types` is
    (the floating type written, the ``gguf`` format's tensor type): the float32 `model` is
    written in the first (``ShrinkConfig.written_dtype``), the ``gguf`` format in the second
    (``ShrinkConfig.written_gguf_type``; None: f32), the ``onnx`` format in float32 (what
    ONNX Runtime's CPU kernels run; its record says so where the type written is another).
    """
    written, gguf = types
    records, size, storage = [], 0, ""
    alone = len(config.formats) == 1 and FORMATS[config.formats[0]]
    for number, form in enumerate(config.formats):
        target = stage if alone else stage / (form if FORMATS[form] else f"model.{form}")
        dtype = gguf if form == "gguf" else _format_dtype(form, written)
        inputs = batch_of_two(example) if form == "onnx" else example
        done = export(model, target, form, source=config.source, dtype=dtype, example_inputs=inputs)
        notes = done.notes
        if form == "onnx" and written != torch.float32:
            notes += (
                f"written in float32, not {str(written).removeprefix('torch.')}: the type ONNX "
                "Runtime's CPU kernels run",
            )
        if FORMATS[form] and not any((target / n).exists() for n in TOKENIZER_FILES):
            tokenizer.save_pretrained(str(target))
        files = model_files(target)
        if number == 0:
            size, storage = sum(path.stat().st_size for path in files), storage_of(files)
        relative = "." if target == stage else target.name
        records.append(
            ExportRecord(
                form,
                relative,
                tuple(
                    sorted(
                        str(p.relative_to(stage))
                        for p in (target.rglob("*") if target.is_dir() else [target])
                        if p.is_file()
                    )
                ),
                done.verified_by,
                done.difference,
                notes,
            )
        )
    return tuple(records), size, storage


def _format_dtype(form: str, written: torch.dtype) -> str | None:
    """The `dtype` that ``export`` writes the float32 model in as `form`, a folder format
    or onnx (None: float32)."""
    if form == "onnx" or written == torch.float32:
        return None
    return str(written).removeprefix("torch.")


def batch_of_two(example: dict[str, Tensor]) -> dict[str, Tensor]:
    """`example` with a batch of two rows where it has one: the first row, then it rotated by
    one token (rows that differ), so that a trace keeps the batch axis dynamic."""
    return {
        key: torch.cat([value, value.roll(1, dims=-1)]) if value.shape[0] == 1 else value
        for key, value in example.items()
    }


def model_files(target: Path) -> list[Path]:
    """The weight files of a written model (a file, or the files of a folder)."""
    if target.is_file():
        return [target]
    return sorted(p for p in target.rglob("*") if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))
