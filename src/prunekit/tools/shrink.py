"""``shrink``: one call from a model on disk to a smaller, faster one in a format that runs
without prunekit, measured before and after.

Stages, each a function below: check the source, the output and the config (nothing heavy is
read before) -> read and tokenize the text -> load the model -> measure it -> meet the budget
(``prune_channels`` with calibration and compensation) -> ``compact`` -> distil (optional) ->
measure again -> write every format and the report into a staged folder that takes the output's
place only once all of it is written and checked (``io.atomic.atomic_folder``). A failure at
any stage leaves no output, or the old one as it was.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from prunekit.core.checks import check_number, check_seed
from prunekit.core.errors import (
    is_explained,
    shown,
    type_error,
    value_error,
    warn_caller,
    with_context,
)
from prunekit.export import gguf_reading
from prunekit.export.api import FORMATS, WRITERS
from prunekit.export.hf_folder import DTYPES as TENSOR_TYPES
from prunekit.export.request import GGUF_BLOCK, GGUF_QUANTIZED, GGUF_SOURCE, GGUF_TYPES
from prunekit.io.atomic import atomic_folder, overlaps, same_file
from prunekit.io.files import CheckpointError, refuse_empty_path, writable_folder
from prunekit.structure.budget import AUTO, COUNTED, KINDS, Budget, BudgetReport
from prunekit.structure.compaction.compact import compact
from prunekit.structure.measure import count_params, paired_latency, perplexity
from prunekit.structure.stages.entry import prune_channels
from prunekit.tools.shrink_report import Before, ExportRecord, ShrinkReport
from prunekit.tools.shrink_source import (
    Source,
    check_source,
    load_source,
    source_dtype,
)
from prunekit.tools.shrink_steps import Texts, distill, export_all, read_passages, text_windows

__all__ = [
    "CRITERIA",
    "DTYPES",
    "LATENCY_RUNS",
    "LR",
    "SEED",
    "Progress",
    "ShrinkConfig",
    "gguf_note",
    "shrink",
]

SEED = 0
"""The seed of a run whose ``ShrinkConfig.seed`` is None."""
LATENCY_RUNS = 5
"""The pairs timed where ``ShrinkConfig.latency_runs`` is None."""
LR = 5e-5
"""The distillation's learning rate where ``ShrinkConfig.lr`` is None."""

# tick(stage label, steps done in it, steps in it): how progress is shown
Progress = Callable[[str, int, int], None]
_TARGETS = ("params", "macs", "latency")
# the group criteria that rank a causal LM's units
REPORT_JSON = "report.json"  # what marks a folder as an output of shrink (replaced whole)
DECI_ROUND = 256  # DeciLM's readers round an MLP width up to a multiple of it
_TRACED = 32  # tokens of the example the model is traced, compacted and checked on
CRITERIA = ("activation", "l2", "l1", "taylor", "obs", "fluctuation")
_FLOAT32 = torch.finfo(torch.float32).max  # the largest lr the distillation's steps take
DTYPES = ("auto", *TENSOR_TYPES)
"""The values of ``ShrinkConfig.dtype``: 'auto' (the source's precision), or the floating
type the shrunk model is written in."""
_HALF = ("float16", "bfloat16")
# the GGUF tensor type of a model written in a half type (float32: the writer's own, f32)
_GGUF_HALF = {torch.float16: "f16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class ShrinkConfig:
    """What to shrink, to what, and how; checked once, on creation.

    Args:
        source: a Hugging Face folder (one weights file or shards) or a GGUF file, of the
            Llama family, with its tokenizer.
        out: the output folder: its parent must exist; an existing one must be empty or an
            earlier output of ``shrink`` (with its report.json), and is replaced whole.
        params, macs, latency: the share to remove, exactly one of them, in (0, 1): of the
            non-embedding parameters, of the multiply-accumulates, or of the measured CPU time
            of one forward (``prunekit.Budget``).
        calibration: a text file, a folder of text files or JSON lines (``"text"``), or the
            passages themselves; None: Python's help topics (``pydoc_data.topics``). A path
            apart from `out` (neither inside it nor holding it: `out` is replaced whole).
        evaluation: text for the perplexity, as `calibration`; None: the held-out end of the
            calibration text (never calibrated on).
        formats: the formats to write (``prunekit.export.FORMATS``), at least one. With one
            folder format, `out` is the model folder; otherwise each folder format goes to
            ``out/<format>`` and each file format to ``out/model.<format>``.
        gguf_type: the tensor type of the ``gguf`` format (``prunekit.export.request.GGUF_TYPES``:
            f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0), or 'source' (a GGUF source only):
            each tensor in the type the source holds it in (re-quantized; F16 where that is
            a type the ``gguf`` package does not quantize, the K and IQ types). None: with
            `dtype` 'auto' and a GGUF source, 'source' (so that SmolLM2's Q4_1 file keeps
            its Q8_0 embedding); else as the type written (f32, f16 or bf16). Under a
            quantized type the model's matrices are rounded to it (each to its own under
            'source') before the perplexity after is measured, so that the perplexity is of
            the file's weights; every format written holds them.
        compensate: the least-squares update of the layers that read removed units.
        round_to: channel widths kept a multiple of it (>= 1); None: 256 with the ``deci``
            format (whose readers derive MLP widths rounded to 256); else a multiple of the
            block of every quantized type the ``gguf`` format is written in (32: a matrix
            whose rows are not a multiple of it could not be quantized, and would be
            written F16); else 1 (``channel_step``).
        distill: seconds of distillation from the dense model on the calibration text (0: none).
        calibration_tokens, evaluation_tokens: tokens of each (>= `length`). 16384 by
            default: SmolLM2-135M at 20 %, calibrated on a mixture of five kinds of text,
            was 2.04x dense perplexity on the worst of them held out with 4096 tokens,
            1.67x with 16384 and 1.69x with 32768.
        length: tokens per window (>= 2); also the latency's input length.
        criterion: the group criterion that ranks units (``prunekit.structure.scoring``).
        kinds: what the budget may remove ('channels', 'heads', 'hidden'); None: channels
            and heads, or channels alone with the ``deci`` format (whose query heads are
            the same in every layer).
        floor: the least share of its units every group (a layer's MLP width, its query
            heads) keeps: a float in [0, 1) (``Budget(floor=...)``; 0: none), or 'auto'
            (None, the default: 0.9 of the highest floor the share asked allows; without
            one with `--streamed`, which allocates block by block). A cut spread more evenly
            keeps held-out text better: SmolLM2-135M at 20 %, calibrated on a mixture of
            five kinds of text, was 1.67x dense perplexity on the worst of them without a
            floor, 1.58x at 0.5 and 1.55x at 0.65; at 35 %, 2.64x without one and 2.40x at
            0.5. A floor too high for the share asked is refused when the budget is met.
        seed: seeds torch for the run; None: ``SEED`` (0). ``shrink_folder`` (streamed)
            draws nothing at random and refuses one given.
        latency_runs: alternated pairs timed for the latency before and after (>= 1); None:
            ``LATENCY_RUNS`` (5). ``shrink_folder`` (streamed) times nothing and refuses
            one given.
        lr: the distillation's learning rate; None: ``LR`` (5e-5). Refused given with
            `distill` 0, which distils nothing (hence with ``shrink_folder``, streamed,
            which takes only `distill` 0).
        dtype: the floating type the shrunk model is written in (``DTYPES``): 'auto' (the
            default) keeps the source's (``shrink_source.source_dtype``: a bfloat16 folder is
            written in bfloat16; a quantized GGUF file in float16, or bfloat16 where its
            unquantized matrices are BF16), or 'float32', 'float16', 'bfloat16'. The model
            is pruned, compensated and distilled in float32, then its weights are rounded to
            `dtype` (its matrices to the ``gguf`` format's quantized type, where it has one);
            the perplexity after is of those weights, as written (computed in float32, as
            the source's before). It is the type of the ``hf`` and ``deci`` folders and of
            the ``gguf`` file where `gguf_type` is None and the source is no GGUF file;
            an ``onnx`` file is float32 (the type ONNX Runtime's CPU kernels run), so
            'float16' or 'bfloat16' with ``onnx`` the only format is refused.
            ``shrink_folder`` (streamed) writes each tensor in its stored type: 'auto' only.
    """

    source: Path
    out: Path
    params: float | None = None
    macs: float | None = None
    latency: float | None = None
    calibration: Path | tuple[str, ...] | None = None
    evaluation: Path | tuple[str, ...] | None = None
    formats: tuple[str, ...] = ("hf",)
    gguf_type: str | None = None
    compensate: bool = True
    round_to: int | None = None
    distill: float = 0.0
    calibration_tokens: int = 16384
    evaluation_tokens: int = 2048
    length: int = 256
    criterion: str = "activation"
    kinds: tuple[str, ...] | None = None
    floor: float | str | None = None
    seed: int | None = None
    latency_runs: int | None = None
    lr: float | None = None
    dtype: str = "auto"

    def __post_init__(self) -> None:
        for name in ("source", "out"):
            value = getattr(self, name)
            if not isinstance(value, str | os.PathLike):
                raise type_error(f"ShrinkConfig: invalid {name}={value!r}; expected a path")
            refuse_empty_path("ShrinkConfig", name, value)
            object.__setattr__(self, name, Path(value))
        for name in ("calibration", "evaluation"):
            object.__setattr__(self, name, _text_source(name, getattr(self, name)))
        formats = self.formats
        listed = isinstance(formats, tuple | list) and bool(formats)
        if not listed or any(f not in FORMATS for f in formats) or len(set(formats)) < len(formats):
            raise value_error(
                f"ShrinkConfig: invalid formats={formats!r}; expected distinct formats among "
                f"{', '.join(FORMATS)}, at least one"
            )
        object.__setattr__(self, "formats", tuple(formats))
        self._check_gguf_type()
        self._check_dtype()
        if isinstance(self.kinds, str | bytes):  # tuple() would split it into letters
            raise type_error(
                f"ShrinkConfig: invalid kinds={self.kinds!r}; expected a tuple of kinds such "
                "as ('channels',) or ('channels', 'heads'), or None"
            )
        if isinstance(self.kinds, list):  # held as a tuple: the frozen config stays hashable
            object.__setattr__(self, "kinds", tuple(self.kinds))
        self._defaults()
        if not isinstance(self.compensate, bool):
            raise type_error(
                f"ShrinkConfig: invalid compensate={self.compensate!r}; expected True or False"
            )
        if self.criterion not in CRITERIA:
            raise value_error(
                f"ShrinkConfig: invalid criterion={self.criterion!r}; expected one of "
                f"{', '.join(CRITERIA)}"
            )
        self._check_numbers()
        self._check_budget()
        _ = self.budget  # one target, the rest checked by Budget
        self._check_deci()

    def _check_gguf_type(self) -> None:
        if self.gguf_type is None:
            return
        if self.gguf_type not in (*GGUF_TYPES, GGUF_SOURCE):
            raise value_error(
                f"ShrinkConfig: invalid gguf_type={self.gguf_type!r}; expected one of "
                f"{', '.join(GGUF_TYPES)}, {GGUF_SOURCE!r} (each tensor in its GGUF source's "
                "type), or None (the source's types for a GGUF source, else the type written)"
            )
        if "gguf" not in self.formats:
            raise value_error(
                f"ShrinkConfig: gguf_type={self.gguf_type!r} with formats={self.formats!r}; "
                "gguf_type is the tensor type of the 'gguf' format: add 'gguf' to formats"
            )

    def _check_dtype(self) -> None:
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise value_error(
                f"ShrinkConfig: invalid dtype={self.dtype!r}; expected one of "
                f"{', '.join(repr(d) for d in DTYPES)} (by name; 'auto': the source's precision)"
            )
        if self.dtype in _HALF and self.formats == ("onnx",):
            raise value_error(
                f"ShrinkConfig: dtype={self.dtype!r} with formats={self.formats!r}; the onnx "
                "format is written in float32 (the type ONNX Runtime's CPU kernels run), so "
                f"nothing would be {self.dtype}: expected dtype 'auto' or 'float32', or a "
                "format that holds it (hf, deci, gguf)"
            )

    def written_dtype(self, source: torch.dtype) -> torch.dtype:
        """The floating type the shrunk model is written in: `dtype`, or `source` (the
        source's, ``shrink_source.source_dtype``) where it is 'auto'.

        Args:
            source: the floating type of the source's weights.

        Returns:
            torch.float32, torch.float16 or torch.bfloat16.
        """
        return source if self.dtype == "auto" else TENSOR_TYPES[self.dtype]

    def written_gguf_type(self, source: Source, written: torch.dtype) -> str | None:
        """The tensor type of the ``gguf`` format: `gguf_type`; else, with `dtype` 'auto'
        and a GGUF `source`, 'source' (each tensor in the source's type); else f16 or bf16
        for a half `written` type, None (f32) for float32. None also without the ``gguf``
        format.

        Args:
            source: the checked source (``shrink_source.check_source``).
            written: the floating type the model is written in (``written_dtype``).

        Returns:
            One of ``GGUF_TYPES``, 'source' (``request.GGUF_SOURCE``), or None.
        """
        if "gguf" not in self.formats:
            return None
        if self.gguf_type is not None:
            return self.gguf_type
        if self.dtype == "auto" and source.gguf_file is not None:
            return GGUF_SOURCE
        return _GGUF_HALF.get(written)

    def _defaults(self) -> None:
        """Defaults that fit every format asked for (``deci``: channels in steps of 256)."""
        deci = "deci" in self.formats
        if self.kinds is None:
            object.__setattr__(self, "kinds", ("channels",) if deci else ("channels", "heads"))
        if self.round_to is None and deci:
            object.__setattr__(self, "round_to", DECI_ROUND)

    def channel_step(self, gguf: str | None, types: Collection[str] = ()) -> int:
        """The multiple channel widths are kept at: `round_to`; where None, the least
        multiple of the block of every quantized type the ``gguf`` format is written in
        (``GGUF_BLOCK``, 32, for each), else 1.

        Args:
            gguf: the ``gguf`` format's tensor type (``written_gguf_type``), or None.
            types: under 'source', the type each matrix is written in (the values of
                ``gguf_writer.written_types``).
        """
        if self.round_to is not None:
            return self.round_to
        used = set(types) if gguf == GGUF_SOURCE else {gguf}
        return math.lcm(1, *(GGUF_BLOCK for kind in used if kind in GGUF_QUANTIZED))

    def _check_deci(self) -> None:
        rounded = (self.round_to or 1) % DECI_ROUND == 0
        if "deci" in self.formats and (self.kinds != ("channels",) or not rounded):
            raise value_error(
                f"ShrinkConfig: kinds={self.kinds!r} and round_to={self.round_to!r} with format "
                "'deci'; expected kinds=('channels',) and round_to a multiple of "
                f"{DECI_ROUND} (DeciLM's query heads are the same in every layer and its MLP "
                f"widths multiples of {DECI_ROUND}), or format 'hf'"
            )

    def _check_numbers(self) -> None:
        check_number(self.length, "length", "ShrinkConfig", "an int >= 2: tokens per window",
                     lambda v: v >= 2, integral=True)  # fmt: skip
        least = {"round_to": 1, "latency_runs": 1, "seed": 0,
                 "calibration_tokens": 2, "evaluation_tokens": 2}  # fmt: skip
        for name, low in least.items():
            if getattr(self, name) is not None:
                check_number(getattr(self, name), name, "ShrinkConfig", f"an int >= {low}",
                             _at_least(low), integral=True)  # fmt: skip
        self._check_windows()
        if self.seed is not None:
            check_seed(self.seed, "ShrinkConfig")  # and at most what torch takes
            object.__setattr__(self, "seed", int(self.seed))  # a numpy one: torch's
        if self.floor not in (None, AUTO):
            check_number(self.floor, "floor", "ShrinkConfig", "a float in [0, 1) or 'auto'",
                         lambda v: 0 <= v < 1)  # fmt: skip
        check_number(self.distill, "distill", "ShrinkConfig", "a finite number of seconds >= 0",
                     lambda v: 0 <= v < math.inf)  # fmt: skip
        rate = f"a finite float > 0, at most {_FLOAT32:.4g} (the model is float32 while shrunk)"
        if self.lr is not None:
            check_number(self.lr, "lr", "ShrinkConfig", rate, lambda v: 0 < v <= _FLOAT32)
            if not self.distill:  # given, even at its default, it would be ignored
                raise value_error(
                    f"ShrinkConfig: distill={shown(self.distill)} distils nothing (no learning "
                    "rate is used); expected no lr (--lr) unless distill > 0 (--distill "
                    f"SECONDS), got lr={shown(self.lr)}"
                )

    def _check_budget(self) -> None:
        """The share asked and the kinds, refused in the config's words (the parameter
        given), not as the Budget made of them."""
        for name in _TARGETS:
            value = getattr(self, name)
            if value is not None:
                wanted = f"a float in (0, 1): the share of the model's {COUNTED[name]} to remove"
                check_number(value, name, "ShrinkConfig", wanted, lambda v: 0.0 < v < 1.0)
        kinds = self.kinds
        if not isinstance(kinds, tuple):  # a str or list was dealt with before
            raise type_error(
                f"ShrinkConfig: invalid kinds={kinds!r}; expected a tuple of kinds among "
                f"{list(KINDS)}, or None"
            )
        if not kinds or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds):
            raise value_error(
                f"ShrinkConfig: invalid kinds={kinds!r}; expected distinct kinds among "
                f"{list(KINDS)}, at least one, or None"
            )

    def _check_windows(self) -> None:
        """One window of each text at least: `length` at most both token counts (the message
        names both sides, as either may be the one given wrong)."""
        for name in ("calibration_tokens", "evaluation_tokens"):
            tokens = getattr(self, name)
            if self.length > tokens:
                raise value_error(
                    f"ShrinkConfig: length={shown(self.length)} (tokens per window) is more "
                    f"than {name}={shown(tokens)}; expected length at most calibration_tokens="
                    f"{shown(self.calibration_tokens)} and evaluation_tokens="
                    f"{shown(self.evaluation_tokens)} (one window of each): a smaller length "
                    "or more tokens"
                )

    @property
    def run_seed(self) -> int:
        """The seed the run uses: `seed`, or ``SEED`` where None."""
        return SEED if self.seed is None else self.seed

    @property
    def runs(self) -> int:
        """The pairs the run times: `latency_runs`, or ``LATENCY_RUNS`` where None."""
        return LATENCY_RUNS if self.latency_runs is None else self.latency_runs

    @property
    def run_lr(self) -> float:
        """The distillation's learning rate: `lr`, or ``LR`` where None."""
        return LR if self.lr is None else self.lr

    @property
    def budget(self) -> Budget:
        """The budget the config asks for."""
        given = {name: getattr(self, name) for name in _TARGETS if getattr(self, name) is not None}
        if len(given) != 1:
            raise value_error(
                f"ShrinkConfig: params={self.params!r}, macs={self.macs!r}, "
                f"latency={self.latency!r}; expected exactly one of them, such as params=0.25"
            )
        try:
            return Budget(**given, kinds=tuple(self.kinds or ()), runs=self.runs,
                          floor=AUTO if self.floor is None else self.floor)  # fmt: skip
        except (ValueError, TypeError) as error:
            if not is_explained(error):
                raise
            raise with_context(error, "ShrinkConfig") from None


def _at_least(low: int) -> Callable[[float], bool]:
    return lambda value: value >= low


def _text_source(name: str, value: Any) -> Path | tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | os.PathLike):
        refuse_empty_path("ShrinkConfig", name, value)
        return Path(value)
    if (isinstance(value, tuple | list) and value and all(isinstance(t, str) for t in value)
            and any(t.strip() for t in value)):  # fmt: skip
        return tuple(value)
    raise type_error(
        f"ShrinkConfig: invalid {name}={value!r}; expected a path (a text file, a folder of "
        "them or JSON lines) or a sequence of passages, not all blank"
    )


def shrink(config: ShrinkConfig, progress: Progress | None = None) -> ShrinkReport:
    """Prune, compact, (distil), export and measure the model of `config.source`.

    Args:
        config: what to do (``ShrinkConfig``).
        progress: called as ``progress(stage, done, total)`` as stages advance.

    Returns:
        What was done and measured; also written to ``out/report.json`` and ``report.md``.

    Raises:
        CheckpointError: a bad source (missing, unreadable, another architecture, no
            tokenizer), output (a file, the source or inside it, no parent) or text.
        ValueError: a target the budget's constraints cannot meet, too little text, a model
            a format cannot express; in every case no output is left behind (an existing
            one stays as it was).
    """
    with gguf_reading.shared():  # a GGUF source's reader made once for every step
        return _shrink(config, progress)


def _shrink(config: ShrinkConfig, progress: Progress | None) -> ShrinkReport:
    """shrink's work."""
    tick = progress or (lambda label, done, total: None)
    source, out = _checked_paths(config)
    _check_writers(config)
    passages = read_passages(config)
    _warn_unless_held_out(config)
    clock = _Clock(tick)
    written = config.written_dtype(source_dtype(source))
    gguf = config.written_gguf_type(source, written)
    measured = _Measured(dtype=written, gguf=gguf)
    with clock("load model", 1):
        model, tokenizer = load_source(source)
    if gguf == GGUF_SOURCE:
        measured.kept, measured.types = _source_types(model, source)
    _refuse_beyond(model, measured.dtype, "the source's")  # at once, not after the pruning
    with clock("tokenize", 1):
        texts = text_windows(config, tokenizer, model, passages)
    torch.manual_seed(config.run_seed)
    dense = copy.deepcopy(model)
    with clock("perplexity before", 1):
        measured.ppl_before = perplexity(model, texts.evaluation)
    # traced, compacted and checked on a few tokens; timed (and a latency budget probed) on
    # a whole window
    window = {"input_ids": texts.calibration[0][None]}
    example = window if config.latency else {"input_ids": window["input_ids"][:, :_TRACED]}
    with clock("prune (budget)", 1):
        step = config.channel_step(gguf, (measured.types or {}).values())
        measured.found = _prune(model, config, texts.calibration, example, step)
    with clock("compact", 1):
        measured.compacted = _compact(model, example)
    _distil_and_measure(model, dense, texts, config, clock, measured)
    with clock("latency", 1):
        measured.timed = _latency(dense, model, window, config.runs)
    del dense
    measured.tokens = example["input_ids"].numel()
    with atomic_folder(out) as stage:
        _empty(stage)
        with clock("export", 1):
            exported = export_all(model, tokenizer, stage, config, example,
                                  (measured.dtype, measured.gguf))  # fmt: skip
        note = gguf_note(config, measured.gguf, (measured.kept or {}).values())
        exported = (_noted(exported[0], note), *exported[1:])
        report = _report(config, (source, out), model, texts, measured, exported, clock)
        (stage / REPORT_JSON).write_text(report.to_json(), encoding="utf-8")
        (stage / "report.md").write_text(report.to_markdown(), encoding="utf-8")
    return report


def gguf_note(config: ShrinkConfig, gguf: str | None, kinds: Collection[str]) -> str | None:
    """What the ``gguf`` format's record says of a quantized GGUF source's types where they
    are kept (`gguf` 'source'): that the file was re-quantized to the source's one type,
    or in its types tensor by tensor, and which of them were written F16 instead (those the
    ``gguf`` package does not quantize); None where there is nothing to say (another type,
    or a source of float types only).

    Args:
        config: the run's config.
        gguf: the gguf format's tensor type (``ShrinkConfig.written_gguf_type``).
        kinds: the types the source holds its tensors in (``gguf_writer.source_types``'
            values, such as ``"Q4_1"``, ``"Q4_K"``, ``"F32"``).

    Returns:
        The note, or None.
    """
    if "gguf" not in config.formats or gguf != GGUF_SOURCE:
        return None
    held = set(kinds) - {"F32"}  # the vectors' type, and a matrix's kept as it is
    quantized = sorted(k for k in held if k.lower() in GGUF_QUANTIZED)
    other = sorted(k for k in held if k.lower() not in GGUF_TYPES)
    if other:
        return (
            f"in the source's types, tensor by tensor, but F16 for those in "
            f"{', '.join(other)}, which the gguf package does not quantize (llama.cpp's "
            "llama-quantize makes them from this file)"
        )
    if len(held) == 1 and quantized:
        return f"re-quantized to {quantized[0]}, the source's type"
    if quantized:
        return f"re-quantized in the source's types, tensor by tensor ({', '.join(sorted(held))})"
    return None


def _noted(records: tuple[ExportRecord, ...], note: str | None) -> tuple[ExportRecord, ...]:
    """`records` with `note` added to the gguf format's (unchanged where None)."""
    if note is None:
        return records
    return tuple(replace(r, notes=(*r.notes, note)) if r.format == "gguf" else r for r in records)


def _warn_unless_held_out(config: ShrinkConfig) -> None:
    """Warn where the evaluation text is calibration text (the same file with links
    resolved, a file of the calibration folder or the folder holding the calibration file,
    or the same passages): the perplexity after is then measured on what was calibrated on,
    and reads better than on text the model has not seen."""
    calibration, evaluation = config.calibration, config.evaluation
    if isinstance(calibration, Path) and isinstance(evaluation, Path):
        one = same_file(calibration, evaluation)
        if not (one or overlaps(calibration, evaluation)):
            return
        found = f"the evaluation text {evaluation} and the calibration text {calibration} are "
        found += "one file" if one else "one inside the other"
        found += " (links resolved)"
    elif isinstance(calibration, tuple) and isinstance(evaluation, tuple):
        common = len(set(evaluation) & set(calibration))
        if not common:
            return
        found = f"{common} of the {len(evaluation)} evaluation passages are calibration passages"
    else:
        return
    warn_caller(
        f"shrink: {found}: the perplexity is then measured on text calibrated on, not held "
        "out, and reads better than on new text; expected evaluation text apart from the "
        "calibration text (evaluation=, --eval), or none for the held-out end of the "
        "calibration text"
    )


def _check_writers(config: ShrinkConfig) -> None:
    """Refuse a format with no writer in this installation."""
    missing = [f for f in config.formats if f not in WRITERS]
    if missing:
        raise value_error(
            f"shrink: format {missing[0]!r} has no writer in this installation; expected one "
            f"of {', '.join(sorted(WRITERS)) or '(none)'}"
        )


@dataclass
class _Measured:
    """What shrink found and measured on its way, for its report."""

    ppl_before: float = math.nan
    ppl_pruned: float = math.nan
    ppl_after: float = math.nan
    found: BudgetReport | None = None
    compacted: tuple[int, int, int] = (0, 0, 0)  # parameters before, MACs before and after
    timed: Any = None  # paired_latency's result
    tokens: int = 1  # of the example the MACs were counted on
    steps: int = 0  # of distillation
    seconds: float = 0.0
    dtype: torch.dtype = torch.float32  # the type the model is written in
    gguf: str | None = None  # the gguf format's tensor type (None: no gguf format, or f32)
    kept: dict[str, str] | None = None  # under 'source': the source's type of each tensor
    types: dict[str, str] | None = None  # under 'source': the type of each parameter

    @property
    def rounding(self) -> str | dict[str, str] | None:
        """What the matrices are rounded to: each parameter's type under 'source', else the
        gguf format's type where it is block-quantized, else None."""
        if self.types is not None:
            return self.types
        return self.gguf if self.gguf in GGUF_QUANTIZED else None

    @property
    def quantized(self) -> str:
        """The block-quantized types the matrices were rounded to, comma-separated ('')."""
        used = self.types.values() if self.types is not None else [self.gguf or ""]
        return ",".join(sorted({kind for kind in used if kind in GGUF_QUANTIZED}))


def _source_types(model: nn.Module, source: Source) -> tuple[dict[str, str], dict[str, str]]:
    """The type a GGUF `source` holds each tensor in (``gguf_writer.source_types``) and the
    type each parameter of `model` is written in so (``gguf_writer.written_types``)."""
    from prunekit.export import gguf_writer  # noqa: PLC0415  # gguf: only where written

    assert source.gguf_file is not None  # 'source' is refused for another source
    kept = gguf_writer.source_types(source.folder / source.gguf_file)
    return kept, gguf_writer.written_types(model, kept)


def _saved(model: nn.Module) -> list[tuple[str, Tensor]]:
    """The floating tensors `model` saves (its state_dict's, sharing their storage)."""
    return [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]


def _refuse_beyond(model: nn.Module, dtype: torch.dtype, whose: str) -> None:
    """Refuse a finite value of `model` beyond `dtype`'s range (float16's 65504): written in
    `dtype`, it would be inf.

    Raises:
        ValueError: naming the tensor, how many values and the largest.
    """
    if dtype == torch.float32:
        return
    name = str(dtype).removeprefix("torch.")
    for key, tensor in _saved(model):
        beyond = torch.isinf(tensor.to(dtype)) & torch.isfinite(tensor)
        if bool(beyond.any()):
            raise value_error(
                f"shrink: {whose} {key} holds {int(beyond.sum())} values beyond {name}'s range "
                f"(largest {float(tensor[beyond].abs().max()):.6g}; {name} holds up to "
                f"{torch.finfo(dtype).max:.6g}), which would be written as inf; expected "
                "dtype='bfloat16' or 'float32' (--dtype), which hold them"
            )


def _as_written(
    model: nn.Module, dtype: torch.dtype, quantized: str | dict[str, str] | None = None
) -> None:
    """Round the floating tensors `model` saves to `dtype` in place, kept in their own type:
    the model then computes as its weights written in `dtype` do, loaded in float32, and is
    written in `dtype` without a further change. With `quantized`, the matrices are rounded
    as a GGUF file of that type holds them instead (``gguf_writer.stored``: quantized and
    dequantized, F16 where their rows are not whole blocks of 32), exactly the values the
    file holds (quantizing them again gives them back), and written in `dtype` by the other
    formats (within its rounding).

    Args:
        model: the shrunk model, in float32.
        dtype: the floating type it is written in (float32: nothing to do).
        quantized: the block-quantized GGUF type of the ``gguf`` format, or each
            parameter's GGUF type (``gguf_writer.written_types``: the ``gguf`` format in
            its source's types), or None.

    Raises:
        ValueError: a finite value beyond `dtype`'s range (``_refuse_beyond``), or one
            `quantized` makes inf (a block's float16 scale overflows); the model is left as
            it was.
    """
    if dtype == torch.float32 and quantized is None:
        return
    _refuse_beyond(model, dtype, "the shrunk model's")
    rounded = _quantized(model, quantized) if quantized is not None else {}
    with torch.no_grad():
        for _, tensor in _saved(model):
            if tensor.data_ptr() in rounded:  # a tied weight is one tensor, rounded once
                tensor.copy_(rounded[tensor.data_ptr()])
            else:
                tensor.copy_(tensor.to(dtype))


def _quantized(model: nn.Module, quantized: str | dict[str, str]) -> dict[int, Tensor]:
    """The matrices `model` saves, by their storage, as a GGUF file of type `quantized`
    (or of each one's type in it) holds them (quantized, or F16 where their rows are not
    whole blocks), computed before any is changed."""
    from prunekit.export import gguf_writer  # noqa: PLC0415  # gguf: only where written

    found: dict[int, Tensor] = {}
    for key, tensor in _saved(model):
        kind = quantized if isinstance(quantized, str) else quantized.get(key)
        if tensor.dim() < 2 or tensor.data_ptr() in found or kind is None:
            continue
        values = gguf_writer.stored(tensor, kind)
        if bool(torch.isfinite(tensor).all()) and not bool(torch.isfinite(values).all()):
            why = (
                f"whose {kind} blocks would be written with an inf scale"
                if kind in GGUF_QUANTIZED
                else f"beyond {kind}'s range, which would be written as inf"
            )
            scale = "; a block's scale is a float16" if kind in GGUF_QUANTIZED else ""
            raise value_error(
                f"shrink: the shrunk model's {key} holds values {why} (largest "
                f"{float(tensor.abs().max()):.6g}{scale}); expected gguf_type 'f32' or 'bf16' "
                "(--gguf-type) for such weights"
            )
        found[tensor.data_ptr()] = values
    return found


def _distil_and_measure(
    model: nn.Module, dense: nn.Module, texts: Texts, config: ShrinkConfig, clock: _Clock,
    measured: _Measured,
) -> None:  # fmt: skip
    """Distil `model` from `dense` where asked (the perplexity measured before it too), then
    measure the perplexity after: each of the model in the type it is written in (rounded to
    it before the distillation and again after)."""
    _as_written(model, measured.dtype, measured.rounding)
    if config.distill:
        measured.ppl_pruned = perplexity(model, texts.evaluation)
        measured.steps, measured.seconds = distill(
            model, dense, texts.calibration, config, clock.tick
        )
        _as_written(model, measured.dtype, measured.rounding)
    with clock("perplexity after", 1):
        measured.ppl_after = perplexity(model, texts.evaluation)
    if not config.distill:
        measured.ppl_pruned = measured.ppl_after


def _report(
    config: ShrinkConfig, where: tuple[Source, Path], model: nn.Module, texts: Texts,
    measured: _Measured, exported: tuple[tuple[ExportRecord, ...], int, str], clock: _Clock,
) -> ShrinkReport:  # fmt: skip
    """The report of one shrink: `where` is (source, out), `exported` (records, size,
    storage) as export_all returns them."""
    source, out = where
    records, size, storage = exported
    found, compacted, timed, tokens = (
        measured.found,
        measured.compacted,
        measured.timed,
        measured.tokens,
    )
    assert found is not None
    return ShrinkReport(
        source=str(config.source),
        out=str(out),
        target=(found.budget.measure, found.budget.share),
        achieved=found.achieved,
        budget_table=str(found),
        groups=tuple((r.name, r.kind, r.before, r.after) for r in found.rows),
        params=Before(compacted[0], count_params(model)),
        macs=Before(compacted[1] / tokens, compacted[2] / tokens),
        bytes=Before(source.bytes, size),
        perplexity=Before(measured.ppl_before, measured.ppl_after),
        perplexity_pruned=measured.ppl_pruned,
        latency_ms=Before(timed.before_ms, timed.after_ms),
        latency_pairs=timed.pairs,
        speedup=timed.ratio,
        calibration=(len(texts.calibration), config.length),
        evaluation=(len(texts.evaluation), config.length),
        distill_steps=measured.steps,
        distill_seconds=measured.seconds,
        exports=records,
        text=texts.names,
        seconds=tuple(clock.seconds.items()),
        storage=(source.storage, storage),
        dtype=str(measured.dtype).removeprefix("torch."),
        gguf_type=measured.quantized,
    )


class _Clock:
    """``with clock(label, 1):`` ticks the stage as started and done, and times it."""

    def __init__(self, tick: Progress) -> None:
        self.tick = tick
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, label: str, total: int) -> Iterator[None]:
        self.tick(label, 0, total)
        started = time.perf_counter()
        yield
        self.seconds[label] = round(time.perf_counter() - started, 3)
        self.tick(label, total, total)


def _checked_paths(config: ShrinkConfig) -> tuple[Source, Path]:
    """The source, checked, and the output folder, checked apart from it."""
    source = check_source(config.source)
    if config.gguf_type == GGUF_SOURCE and source.gguf_file is None:
        raise value_error(
            f"ShrinkConfig: gguf_type={GGUF_SOURCE!r} writes each tensor in the type its GGUF "
            f"source holds it in, and source={str(config.source)!r} is a Hugging Face folder "
            f"({source.storage or 'no GGUF types'}); expected a GGUF source, or gguf_type "
            f"one of {', '.join(GGUF_TYPES)} (--gguf-type)"
        )
    out = config.out
    if overlaps(source.path, out) or (overlaps(source.folder, out) and source.gguf_file is None):
        raise CheckpointError(
            f"{out}: is, holds or lies inside the source {source.path} (links resolved); "
            "expected an output folder apart from it (the source is never changed)"
        )
    out = writable_folder(out, "the shrunk model and its report")
    _probe(out)
    if out.is_dir() and any(out.iterdir()) and not (out / REPORT_JSON).is_file():
        raise CheckpointError(
            f"{out}: holds files but no {REPORT_JSON}, so it is no output of shrink; expected "
            "a new or empty folder, or one an earlier shrink wrote (which is replaced whole)"
        )
    return source, out


def _probe(out: Path) -> None:
    """Refuse, before the heavy work, an output whose folder takes no new folder: the result
    is staged beside it."""
    try:
        Path(tempfile.mkdtemp(prefix=f".{out.name}.probe.", dir=out.absolute().parent)).rmdir()
    except OSError as error:
        raise CheckpointError(
            f"{out}: its folder {out.absolute().parent} takes no new folder ({error.strerror}); "
            "expected an output in a folder that can be written"
        ) from None


def _prune(
    model: nn.Module,
    config: ShrinkConfig,
    windows: list[Tensor],
    example: dict[str, Tensor],
    step: int,
) -> BudgetReport:
    """Meet the budget: the units of least score for their cost, masked (and compensated),
    channel widths a multiple of `step`."""
    labels = config.criterion == "taylor"  # the one criterion that needs the model's loss
    batches = [{"input_ids": w[None], **({"labels": w[None]} if labels else {})} for w in windows]
    found = prune_channels(
        model,
        example,
        budget=config.budget,
        criterion=config.criterion,
        calibration=batches,
        compensate=config.compensate,
        round_to=step,
    )
    assert isinstance(found, BudgetReport)
    return found


def _compact(model: nn.Module, example: dict[str, Tensor]) -> tuple[int, int, int]:
    """Compact in place; (parameters before, MACs before, MACs after) on `example`."""
    with warnings.catch_warnings():  # widths that differ per layer: the exporters write them
        warnings.simplefilter("ignore", UserWarning)
        done = compact(model, example, latency_runs=0)
    return done.params_before, done.macs_before, done.macs_after


def _latency(dense: nn.Module, small: nn.Module, example: dict[str, Tensor], runs: int) -> Any:
    current = [dense]

    def forward() -> None:
        with torch.inference_mode():
            current[0](**example)

    return paired_latency(
        lambda: current.__setitem__(0, dense), lambda: current.__setitem__(0, small), forward, runs
    )


def _empty(stage: Path) -> None:
    """Remove what the stage took over from an existing output (links to its files): the
    output is replaced whole."""
    for path in stage.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
