"""What ``prunekit shrink`` did and measured: the numbers, as JSON and Markdown for the report
files and as lines for the terminal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from prunekit.core.standard_json import NOT_FINITE, dumps, restored, standard
from prunekit.report import human_bytes

__all__ = ["NOT_FINITE", "Before", "ExportRecord", "ShrinkReport"]

_MEASURES = ("params", "macs", "bytes", "perplexity", "latency_ms")


@dataclass(frozen=True)
class Before:
    """One measure before and after.

    Attributes:
        before: of the model as loaded.
        after: of the shrunk model.
    """

    before: float
    after: float

    @property
    def ratio(self) -> float:
        """after / before (0 where before is 0)."""
        return self.after / self.before if self.before else 0.0


@dataclass(frozen=True)
class ExportRecord:
    """One format written: where (relative to the output folder), its files, and how the
    written model was checked (None: not checked)."""

    format: str
    path: str
    files: tuple[str, ...]
    verified_by: str | None
    difference: float | None
    notes: tuple[str, ...]

    @property
    def checked(self) -> str:
        """How it was checked, in words."""
        if self.verified_by is None:
            return "not checked"
        if self.difference is None:
            return f"checked by {self.verified_by}"
        return f"checked by {self.verified_by}: max relative difference {self.difference:.2e}"


@dataclass(frozen=True)
class ShrinkReport:
    """The outcome of ``shrink``.

    Attributes:
        source: the model it started from.
        out: the output folder.
        target: what the budget counted ('params', 'macs' or 'latency') and the share asked.
        achieved: the share of it removed (for latency: as the probes estimated it).
        budget_table: the budget's table (``str(BudgetReport)``).
        groups: each group's name, kind, units before and after.
        params: parameters before and after (embeddings included).
        macs: multiply-accumulates per token before and after (linear layers).
        bytes: the weights on disk before (the source's files) and after (the written model).
        perplexity: before and after, on the evaluation windows: of the source's weights and
            of the shrunk model's as written (in `dtype`), each computed in float32.
        perplexity_pruned: after pruning and compaction, before distillation (in `dtype`).
        latency_ms: one forward of one window before and after (median of alternated pairs),
            timed in float32 (PyTorch on the CPU) whatever `dtype` is: the shrunk model's
            weights as written, computed in float32, as the perplexity is.
        latency_pairs: the alternated pairs timed.
        speedup: the median of the pairs' ratios (above 1: faster).
        calibration: windows x tokens calibrated on; ``evaluation`` the same for perplexity.
        distill_steps, distill_seconds: distillation done (0 when none).
        exports: the formats written.
        text: where the calibration and evaluation text came from.
        seconds: wall time of each stage.
        storage: how the weights are stored before (the source) and after (the first format
            written), such as ``("GGUF Q4_1", "GGUF F32")``: bytes on disk compare only
            where they are alike.
        dtype: the floating type the shrunk model was written in ('float32', 'float16' or
            'bfloat16'; the ``onnx`` format is float32, the ``gguf`` format in its
            ``gguf_type`` where given); '' in a report from before it was recorded.
        gguf_type: the ``gguf`` format's tensor type where it is block-quantized ('q8_0',
            'q4_0', ...), or the block-quantized types of its matrices, comma-separated,
            where it holds each in its GGUF source's type ('q4_1,q8_0'): the shrunk model's
            matrices were rounded to it before the perplexity after was measured, and every
            format holds them so (the folders in `dtype`, within its rounding); '' where
            none is.
    """

    source: str
    out: str
    target: tuple[str, float]
    achieved: float
    budget_table: str
    groups: tuple[tuple[str, str, int, int], ...]
    params: Before
    macs: Before
    bytes: Before
    perplexity: Before
    perplexity_pruned: float
    latency_ms: Before
    latency_pairs: int
    speedup: float
    calibration: tuple[int, int]
    evaluation: tuple[int, int]
    distill_steps: int
    distill_seconds: float
    exports: tuple[ExportRecord, ...]
    text: tuple[str, str]
    seconds: tuple[tuple[str, float], ...]
    storage: tuple[str, str] = ("", "")
    dtype: str = ""
    gguf_type: str = ""

    @property
    def faster(self) -> str:
        """The speed-up in words: 'N.NNx faster' or 'N.NNx slower'."""
        if self.speedup >= 1.0 or not self.speedup:
            return f"{self.speedup:.2f}x faster"
        return f"{1.0 / self.speedup:.2f}x slower"

    def to_dict(self) -> dict[str, Any]:
        """The report as standard JSON values.

        Returns:
            The fields as plain values (the before-and-after measures with their ratio); a
            value that is not finite (an infinite perplexity: a mean loss beyond what exp can
            hold) is None, and ``not_finite`` maps where it was (``'perplexity.after'``,
            ``'exports.0.difference'``) to what it was (``'inf'``, ``'-inf'`` or ``'nan'``,
            which ``float`` reads back); empty where every value is finite.
        """
        found = asdict(self)
        for name in _MEASURES:
            found[name]["ratio"] = getattr(self, name).ratio
        found["target"] = {"measure": self.target[0], "share": self.target[1]}
        found["groups"] = [
            dict(zip(("name", "kind", "before", "after"), g, strict=True)) for g in self.groups
        ]
        found["calibration"] = dict(zip(("windows", "tokens"), self.calibration, strict=True))
        found["evaluation"] = dict(zip(("windows", "tokens"), self.evaluation, strict=True))
        found["text"] = dict(zip(("calibration", "evaluation"), self.text, strict=True))
        found["seconds"] = dict(self.seconds)
        return standard(found)  # not_finite named (core.standard_json)

    def to_json(self) -> str:
        """The report as a standard JSON document (``to_dict``: no Infinity or NaN)."""
        return dumps(self.to_dict())

    @classmethod
    def from_dict(cls, found: Mapping[str, Any]) -> ShrinkReport:
        """The report `to_dict` (or report.json, read) describes, its values that are not
        finite restored.

        Args:
            found: what ``to_dict`` gave, or report.json as ``json.load`` reads it.

        Returns:
            The report.

        Raises:
            KeyError: a field is missing.
        """
        values = restored(found)
        pairs = {n: Before(values[n]["before"], values[n]["after"]) for n in _MEASURES}
        return cls(
            source=values["source"],
            out=values["out"],
            target=(values["target"]["measure"], values["target"]["share"]),
            achieved=values["achieved"],
            budget_table=values["budget_table"],
            groups=tuple((g["name"], g["kind"], g["before"], g["after"]) for g in values["groups"]),
            perplexity_pruned=values["perplexity_pruned"],
            latency_pairs=values["latency_pairs"],
            speedup=values["speedup"],
            calibration=(values["calibration"]["windows"], values["calibration"]["tokens"]),
            evaluation=(values["evaluation"]["windows"], values["evaluation"]["tokens"]),
            distill_steps=values["distill_steps"],
            distill_seconds=values["distill_seconds"],
            exports=tuple(
                ExportRecord(**{**e, "files": tuple(e["files"]), "notes": tuple(e["notes"])})
                for e in values["exports"]
            ),
            text=(values["text"]["calibration"], values["text"]["evaluation"]),
            seconds=tuple(values["seconds"].items()),
            storage=(values["storage"][0], values["storage"][1]),
            dtype=values.get("dtype", ""),  # none in a report written before it was recorded
            gguf_type=values.get("gguf_type", ""),
            **pairs,
        )

    def summary(self) -> list[str]:
        """The before-and-after lines the command prints."""
        p, s, b, t = self.perplexity, self.params, self.bytes, self.latency_ms
        lines = [
            f"perplexity  {p.before:10.3f} -> {p.after:10.3f}  ({p.ratio:.3f}x; "
            f"{self.evaluation[0]} x {self.evaluation[1]} tokens of {self.text[1]}"
            f"{self._written})",
            f"parameters  {s.before:10,.0f} -> {s.after:10,.0f}  ({1 - s.ratio:.1%} fewer)",
            f"MACs/token  {self.macs.before:10,.0f} -> {self.macs.after:10,.0f}  "
            f"({1 - self.macs.ratio:.1%} fewer)",
            f"on disk     {human_bytes(int(b.before)):>10} -> {human_bytes(int(b.after)):>10}  "
            f"({self.storage[0]} -> {self.storage[1]})",
            f"latency     {t.before:8.2f} ms -> {t.after:8.2f} ms  ({self.faster}, median of "
            f"{self.latency_pairs} alternated pairs, 1 x {self.evaluation[1]} tokens, timed in "
            f"float32{', not ' + self._untimed if self._untimed else ''})",
        ]
        if self.distill_steps:
            lines.insert(
                1,
                f"  (one shot {self.perplexity_pruned:.3f}; distilled "
                f"{self.distill_steps} steps in {self.distill_seconds:.0f} s)",
            )
        return lines

    @property
    def _untimed(self) -> str:
        """The type the model is written in where it is not float32 (the type timed)."""
        return self.dtype if self.dtype not in ("", "float32") else ""

    @property
    def _written(self) -> str:
        """'; <dtype> weights as written' (', matrices rounded to <type>' where quantized),
        or '' where the report does not say."""
        if not self.dtype:
            return ""
        kinds = self.gguf_type.upper().split(",") if self.gguf_type else []
        if len(kinds) > 1:  # several: the source's types, each matrix in its own
            listed = ", ".join(kinds[:-1]) + " and " + kinds[-1]
            rounded = f", matrices rounded to the source's {listed},"
        else:
            rounded = f", matrices rounded to {kinds[0]}," if kinds else ""
        return f"; {self.dtype} weights{rounded} as written"

    def to_markdown(self) -> str:
        """The report as a Markdown page."""
        measure, share = self.target
        rows = [
            ("perplexity", f"{self.perplexity.before:.3f}", f"{self.perplexity.after:.3f}"),
            ("parameters", f"{self.params.before:,.0f}", f"{self.params.after:,.0f}"),
            ("MACs per token", f"{self.macs.before:,.0f}", f"{self.macs.after:,.0f}"),
            (
                "weights on disk",
                f"{human_bytes(int(self.bytes.before))} ({self.storage[0]})",
                f"{human_bytes(int(self.bytes.after))} ({self.storage[1]})",
            ),
            ("latency (ms)", f"{self.latency_ms.before:.2f}", f"{self.latency_ms.after:.2f}"),
        ]
        lines = [
            "# prunekit shrink",
            "",
            f"`{self.source}` -> `{self.out}`: budget {measure}={share:g}, achieved "
            f"{self.achieved:.2%}.",
            "",
            "| | before | after |",
            "| --- | ---: | ---: |",
            *[f"| {name} | {a} | {b} |" for name, a, b in rows],
            "",
            f"Latency: one forward of 1 x {self.evaluation[1]} tokens in float32 (PyTorch on "
            f"the CPU; the weights as written"
            f"{', not timed in ' + self._untimed if self._untimed else ''}), median of "
            f"{self.latency_pairs} alternated pairs: {self.faster}.",
            f"Calibration: {self.calibration[0]} x {self.calibration[1]} tokens of "
            f"{self.text[0]}; perplexity on {self.evaluation[0]} x {self.evaluation[1]} tokens "
            f"of {self.text[1]}{self._written}, computed in float32.",
        ]
        if self.distill_steps:
            lines.append(
                f"Distillation: {self.distill_steps} steps in "
                f"{self.distill_seconds:.0f} s (one-shot perplexity "
                f"{self.perplexity_pruned:.3f})."
            )
        lines += ["", "## Files", ""]
        for record in self.exports:
            lines.append(f"- {record.format}: `{record.path}` ({record.checked})")
        lines += ["", "## Budget", "", "```text", self.budget_table, "```", ""]
        return "\n".join(lines)
