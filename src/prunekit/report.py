"""What is pruned where: per-tensor sparsity of a model or state_dict, then its renderings.

``report(obj)`` gathers the numbers (a Report); the Report renders them as a
text table (``str``), a dict or JSON, a rich table, or a bar chart in a PNG.
Rendering libraries are imported only when a rendering needs them.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from prunekit._extras import require
from prunekit.core.backend import dtype_name, is_module, is_tensor
from prunekit.core.checks import check_kind, refuse_empty_path
from prunekit.core.counting import zero_count
from prunekit.core.errors import value_error
from prunekit.core.naming import ORIG, entries, mask_name, orig_name, pruned_name
from prunekit.dropin.base_method import BasePruningMethod, PruningContainer
from prunekit.dropin.hooks import find_pruning_hook

if TYPE_CHECKING:  # the 'cli' extra
    from rich.table import Table

__all__ = ["Report", "TensorRow", "human_bytes", "report"]

HEADER = ("tensor", "shape", "elements", "zeros", "sparsity", "mask", "method")


@dataclass(frozen=True)
class TensorRow:
    """One tensor: its size, how many of its entries are zero, and the pruning on it.

    `masked` says a mask is installed (or saved beside it); `method` names the
    pruning method(s) when a module's hook says so, else it is None.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    numel: int
    zeros: int
    masked: bool
    method: str | None
    itemsize: int

    @property
    def sparsity(self) -> float:
        """Fraction of entries that are zero (0 for an empty tensor)."""
        return self.zeros / self.numel if self.numel else 0.0

    @property
    def dense_bytes(self) -> int:
        """Bytes of the tensor stored dense."""
        return self.numel * self.itemsize

    @property
    def sparse_bytes(self) -> int:
        """Bytes stored sparse: the non-zero values plus a bitmap of one bit per entry."""
        return (self.numel - self.zeros) * self.itemsize + math.ceil(self.numel / 8)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "numel": self.numel,
            "zeros": self.zeros,
            "sparsity": self.sparsity,
            "masked": self.masked,
            "method": self.method,
            "dense_bytes": self.dense_bytes,
            "sparse_bytes": self.sparse_bytes,
        }


@dataclass(frozen=True)
class Report:
    """The rows of a report, one per tensor, and their totals.

    ``str()`` is a text table; ``to_dict()``, ``to_json()``, ``rich_table()`` and ``plot()`` are
    the other renderings.

    Attributes:
        rows: one row per tensor (name, shape, dtype, entries, zeros, whether masked, the
            method), in the model's or state_dict's order.
    """

    rows: tuple[TensorRow, ...]

    @property
    def numel(self) -> int:
        return sum(r.numel for r in self.rows)

    @property
    def zeros(self) -> int:
        return sum(r.zeros for r in self.rows)

    @property
    def nonzeros(self) -> int:
        return self.numel - self.zeros

    @property
    def sparsity(self) -> float:
        """Fraction of all entries that are zero."""
        return self.zeros / self.numel if self.numel else 0.0

    @property
    def dense_bytes(self) -> int:
        return sum(r.dense_bytes for r in self.rows)

    @property
    def sparse_bytes(self) -> int:
        return sum(r.sparse_bytes for r in self.rows)

    def __getitem__(self, name: str) -> TensorRow:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no tensor named {name!r} in this report")

    def totals(self) -> dict[str, Any]:
        """The sums over all rows.

        Returns:
            ``tensors``, ``masked`` (how many carry a mask), ``numel``, ``zeros``,
            ``nonzeros``, ``sparsity``, ``dense_bytes`` and ``sparse_bytes``, by name.
        """
        return {
            "tensors": len(self.rows),
            "masked": sum(r.masked for r in self.rows),
            "numel": self.numel,
            "zeros": self.zeros,
            "nonzeros": self.nonzeros,
            "sparsity": self.sparsity,
            "dense_bytes": self.dense_bytes,
            "sparse_bytes": self.sparse_bytes,
        }

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data, for JSON or a table of your own.

        Returns:
            ``{"tensors": [one dict per row], "totals": self.totals()}``.
        """
        return {"tensors": [r.to_dict() for r in self.rows], "totals": self.totals()}

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text.

        Args:
            indent: the indent of ``json.dumps``; None writes one line.

        Returns:
            ``to_dict()`` as JSON.
        """
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        columns = self._columns()
        header = HEADER[:columns]
        body = [_cells(r)[:columns] for r in self.rows]
        total = self.totals()
        footer = (
            "total",
            f"{total['tensors']} tensors",
            f"{self.numel:,}",
            f"{self.zeros:,}",
            f"{self.sparsity:.1%}",
            str(total["masked"]),
            "",
        )[:columns]
        widths = [max(len(line[i]) for line in [header, *body, footer]) for i in range(columns)]
        rule = "  ".join("-" * w for w in widths)
        lines = [_line(header, widths), rule, *(_line(b, widths) for b in body), rule]
        lines.append(_line(footer, widths))
        lines.append(
            f"size: {human_bytes(self.dense_bytes)} dense, "
            f"{human_bytes(self.sparse_bytes)} stored sparse (values + bitmap)"
        )
        return "\n".join(lines)

    def rich_table(self, title: str | None = None) -> Table:
        """The report as a ``rich.table.Table`` (needs the 'cli' extra).

        Args:
            title: the table's title (shown as it is, never read as rich markup); None: none.

        Returns:
            A ``rich.table.Table`` with a footer of totals and a caption of the sizes.

        Raises:
            ImportError: rich is not installed (``pip install 'prunekit[cli]'``).
        """
        table_mod = require("rich.table", "cli", "Report.rich_table")
        text = require("rich.text", "cli", "Report.rich_table").Text  # names are no markup
        table = table_mod.Table(
            title=None if title is None else text(title),
            show_footer=True,
            caption=self._size_line(),
        )
        footer = ("total", "", f"{self.numel:,}", f"{self.zeros:,}", f"{self.sparsity:.1%}")
        columns = self._columns()
        for i, name in enumerate(HEADER[:columns]):
            right = 2 <= i <= 4
            table.add_column(
                name,
                footer=footer[i] if i < len(footer) else "",
                justify="right" if right else "left",
            )
        for row in self.rows:
            table.add_row(*(text(cell) for cell in _cells(row)[:columns]))
        made: Table = table
        return made

    def plot(self, path: str | os.PathLike[str], title: str | None = None) -> Path:
        """Draw the sparsity of each tensor as horizontal bars into the PNG `path`.

        Args:
            path: the PNG file to write (replaced if it exists).
            title: the chart's title; None: the overall sparsity.

        Returns:
            `path`, as a ``Path``.

        Raises:
            ValueError: an empty `path` (Path('') is the current folder).
            ImportError: matplotlib is not installed (``pip install 'prunekit[cli]'``).
        """
        refuse_empty_path("Report.plot", "path", path)  # Path("") is ".": the current folder
        figure_mod = require("matplotlib.figure", "cli", "Report.plot")
        names = [r.name for r in self.rows]
        values = [100 * r.sparsity for r in self.rows]
        height = 1.2 + 0.32 * max(len(names), 1)
        fig = figure_mod.Figure(figsize=(7, height), dpi=100, layout="constrained")
        ax = fig.add_subplot()
        colors = ["#c0392b" if r.masked else "#7f8c8d" for r in self.rows]
        bars = ax.barh(range(len(names)), values, color=colors)
        ax.bar_label(bars, labels=[f"{v:.1f}%" for v in values], padding=3, fontsize=8)
        ax.set_yticks(range(len(names)), labels=names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 110)
        ax.set_xlabel("sparsity (% of entries that are zero)")
        ax.set_ylabel("tensor")
        ax.set_title(title or f"Sparsity per tensor (overall {self.sparsity:.1%})")
        ax.grid(axis="x", alpha=0.3)
        if any(r.masked for r in self.rows):
            patches = require("matplotlib.patches", "cli", "Report.plot")
            kinds = [("#c0392b", "mask installed"), ("#7f8c8d", "no mask")]
            handles = [patches.Patch(color=c, label=text) for c, text in kinds]
            ax.legend(handles=handles, loc="lower right", fontsize=8)
        target = Path(path)
        fig.savefig(target, format="png")
        return target

    def _columns(self) -> int:
        """How many of HEADER to show: 'method' only when some row names one."""
        return len(HEADER) if any(r.method for r in self.rows) else len(HEADER) - 1

    def _size_line(self) -> str:
        return (
            f"{self.nonzeros:,} non-zero of {self.numel:,}; "
            f"{human_bytes(self.dense_bytes)} dense, {human_bytes(self.sparse_bytes)} sparse"
        )


def report(source: nn.Module | Mapping[str, Tensor] | Any) -> Report:
    """Report on a model (pruned or not) or a state_dict (with or without masks).

    A model gives one row per floating-point parameter, a pruned one under its
    own name (``conv.weight``, not ``conv.weight_orig``), valued as mask * orig.
    A state_dict cannot tell parameters from buffers, so every floating-point
    tensor in it gets a row; ``<n>_orig`` + ``<n>_mask`` pairs are one row ``<n>``.

    Args:
        source: a torch or TensorPlay model, or a state_dict.

    Returns:
        The Report: its rows, totals and sizes; ``str()``, ``to_dict()``, ``to_json()``,
        ``rich_table()`` and ``plot(path)`` render it.

    Raises:
        TypeError: `source` is neither a model nor a mapping.
        ValueError: a tensor without values to count (meta) or of a sparse layout, or a
            mask of another shape than its tensor's, by name.
    """
    if isinstance(source, Mapping):
        return Report(tuple(_state_rows(source)))
    if is_module(source):
        return Report(tuple(_module_rows(source)))
    raise TypeError(
        f"report: expected an nn.Module or a state_dict (a mapping of names to tensors), "
        f"got {type(source).__name__}"
    )


def human_bytes(count: int) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def check_countable(model: nn.Module) -> None:
    """Refuse, as ``report(model)`` would, a model with a tensor whose zeros cannot be
    counted: for a call that returns the report, before it changes the model.

    Args:
        model: a torch or TensorPlay model.

    Raises:
        ValueError: a parameter or mask without values (meta) or of a sparse layout, by name.
    """
    if not is_module(model):  # left to the caller's own check of the model
        return
    for name, tensor, mask, _ in _module_entries(model):
        _check_countable(name, tensor, mask, None)


def _module_entries(
    model: nn.Module,
) -> Iterator[tuple[str, Tensor, Tensor | None, nn.Module]]:
    """Each floating-point parameter once: its name (a pruned one's own, not ``_orig``), its
    values, its mask (None: not pruned) and its module."""
    seen = set()
    for prefix, module in model.named_modules():
        dot = prefix + "." if prefix else ""
        for pname, param in module._parameters.items():
            if param is None or id(param) in seen or not param.is_floating_point():
                continue
            seen.add(id(param))
            base = pruned_name(pname, ORIG)
            mask = module._buffers.get(mask_name(base)) if base is not None else None
            if base is None or mask is None:
                yield dot + pname, param.detach(), None, module
            else:
                yield dot + base, param.detach(), mask, module


def _module_rows(model: nn.Module) -> list[TensorRow]:
    rows = []
    for name, tensor, mask, module in _module_entries(model):
        hook = None
        if mask is not None:
            _, hook = find_pruning_hook(module, name.rsplit(".", 1)[-1])
        rows.append(_row(name, tensor, mask, _method_name(hook)))
    return rows


def _state_rows(state: Mapping[str, Tensor]) -> list[TensorRow]:
    for key, value in state.items():
        if not is_tensor(value):
            raise TypeError(
                f"report: state_dict entry {key!r} has type {type(value).__name__}, not a tensor"
            )
    return [
        _row(e.name, e.tensor, e.mask, None, (orig_name(e.name), mask_name(e.name)))
        for e in entries(state)
        if e.tensor.is_floating_point()
    ]


def _row(
    name: str,
    tensor: Tensor,
    mask: Tensor | None,
    method: str | None,
    stored: tuple[str, str] | None = None,
) -> TensorRow:
    """The row of `tensor` (times `mask`), named `name`; `stored`: the names of the tensor
    and its mask where they are stored apart (a state_dict's ``_orig`` and ``_mask``)."""
    _check_countable(name, tensor, mask, stored)
    values = tensor if mask is None else tensor * mask.to(dtype=tensor.dtype)
    return TensorRow(
        name=name,
        shape=tuple(int(s) for s in tensor.shape),
        dtype=dtype_name(tensor.dtype),
        numel=int(tensor.numel()),
        zeros=zero_count(values),
        masked=mask is not None,
        method=method,
        itemsize=int(tensor.element_size()),
    )


def _check_countable(
    name: str, tensor: Tensor, mask: Tensor | None, stored: tuple[str, str] | None
) -> None:
    """Refuse a tensor or mask without values (meta) or of a sparse layout, and a mask of
    another shape than its tensor's, by name."""
    check_kind(tensor, "report", f"tensor {name!r}", real=False)
    if mask is None:
        return
    orig, kept = stored or (orig_name(name), mask_name(name))
    check_kind(mask, "report", f"the mask {kept!r}", real=False)
    if tuple(mask.shape) != tuple(tensor.shape):
        raise value_error(
            f"report: the mask {kept!r} has shape {tuple(mask.shape)}; expected the shape "
            f"of {orig!r}, {tuple(tensor.shape)}"
        )


def _method_name(hook: BasePruningMethod | None) -> str | None:
    """``L1Unstructured(0.5)``; a container's methods joined by ``+``, repeats as ``x3``.
    A method with a ``report_name`` string (prunekit.Gradual) is named by it."""
    if hook is None:
        return None
    own = getattr(hook, "report_name", None)
    if isinstance(own, str):
        return own
    if isinstance(hook, PruningContainer):
        names = [_method_name(m) or "" for m in hook]
        runs = [(name, len(list(group))) for name, group in itertools.groupby(names)]
        return "+".join(name if count == 1 else f"{name} x{count}" for name, count in runs)
    amount = getattr(hook, "amount", None)
    return type(hook).__name__ + (f"({amount})" if amount is not None else "")


def _cells(row: TensorRow) -> tuple[str, ...]:
    return (
        row.name,
        "x".join(map(str, row.shape)) or "scalar",
        f"{row.numel:,}",
        f"{row.zeros:,}",
        f"{row.sparsity:.1%}",
        "yes" if row.masked else "no",
        row.method or "",
    )


def _line(cells: tuple[str, ...], widths: list[int]) -> str:
    parts = [
        c.rjust(w) if 2 <= i <= 4 else c.ljust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    ]
    return "  ".join(parts).rstrip()
