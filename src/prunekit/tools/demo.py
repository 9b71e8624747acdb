"""The main job on embedded data: train a small CNN on 8x8 digits, prune it, measure it.

Data are scikit-learn's bundled digits (1,797 images, no download). The
dense model is pruned step by step with global L1 over its conv and linear
weights, fine-tuned after each step; a structured variant drops half the
channels of each layer but the last. A third run prunes a copy of the dense
model gradually while it trains (GradualPruner: global L1 to 95 % on the cubic
schedule). Seeded and single-threaded, so two runs give the same numbers.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from prunekit._extras import require
from prunekit.core.amount import validate_pruning_amount_init
from prunekit.core.naming import mask_name
from prunekit.core.standard_json import dumps, standard
from prunekit.dropin.calls import global_unstructured, ln_structured
from prunekit.dropin.torch_methods import L1Unstructured
from prunekit.io.files import refuse_empty_path
from prunekit.report import Report, human_bytes, report
from prunekit.schedule import GradualPruner
from prunekit.select.tuning import torch_threads
from prunekit.structure import compact, count_macs, latency_ms, prune_channels

__all__ = ["DemoResult", "DemoRow", "DigitsCNN", "StructuredResult", "run_demo", "run_structured"]

DEFAULT_SPARSITIES = (0.5, 0.75, 0.9)
STRUCTURED_AMOUNT = 0.5
GRADUAL_AMOUNT = 0.95
GRADUAL_EPOCHS = 20
BATCH = 32

# advance(stage label, steps done in it, steps in it): how progress is shown
Progress = Callable[[str, int, int], None]


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions and two linear layers for 1x8x8 images, 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        out: Tensor = self.fc2(x)
        return out

    def prunable(self) -> list[tuple[nn.Module, str]]:
        """The conv and linear weights, which the demo prunes."""
        return [(m, "weight") for m in (self.conv1, self.conv2, self.fc1, self.fc2)]


@dataclass(frozen=True)
class DemoRow:
    """One model of the demo and what it measures."""

    model: str
    sparsity: float  # fraction of zeros among the conv and linear weights
    accuracy: float  # on the held-out test images
    nonzeros: int  # non-zero parameters, biases included
    params: int
    dense_bytes: int
    sparse_bytes: int


@dataclass(frozen=True)
class DemoResult:
    """The demo's table, the report of its sparsest model and the files written."""

    rows: tuple[DemoRow, ...]
    report: Report
    files: tuple[Path, ...]
    test_images: int
    structured: StructuredResult | None = None

    def rich_table(self) -> Any:
        """The table of results as a ``rich.table.Table`` (needs the 'cli' extra)."""
        table_mod = require("rich.table", "cli", "the demo's table")
        params = self.rows[0].params
        table = table_mod.Table(
            title=f"Pruning a CNN on 8x8 digits ({self.test_images} test images)",
            caption=f"sparsity: zeros among conv + linear weights; non-zero: of {params:,} "
            "parameters; dense, sparse: sizes (sparse = non-zero values + 1-bit map); "
            f"structured: {STRUCTURED_AMOUNT:.0%} of the output channels of every layer but "
            "the last; gradual: pruned while training, cubic schedule",
        )
        table.add_column("model", no_wrap=True)
        for name in ("sparsity", "test acc.", "non-zero", "dense", "sparse"):
            table.add_column(name, justify="right")
        for r in self.rows:
            table.add_row(
                r.model,
                f"{r.sparsity:.1%}",
                f"{r.accuracy:.2%}",
                f"{r.nonzeros:,}",
                human_bytes(r.dense_bytes),
                human_bytes(r.sparse_bytes),
            )
        return table


def run_demo(
    out: str | os.PathLike[str],
    sparsities: Sequence[float] = DEFAULT_SPARSITIES,
    epochs: int = 20,
    finetune_epochs: int = 6,
    seed: int = 0,
    progress: Progress | None = None,
    gradual_epochs: int = GRADUAL_EPOCHS,
    gradual_amount: float = GRADUAL_AMOUNT,
) -> DemoResult:
    """Train, prune to each of `sparsities` in turn, fine-tune, and write results to `out`.

    `out` receives the sparsest model's state_dict with its masks
    (``pruned.pt``), its report (``report.json``), the table
    (``results.json``) and two plots (``accuracy_vs_sparsity.png``,
    ``sparsity_per_layer.png``). `gradual_epochs` of training prune a copy of the dense
    model gradually to `gradual_amount` (0 epochs: no gradual run).
    """
    refuse_empty_path("run_demo", "out", out)  # Path("") would be the current folder
    steps = _checked(sparsities, epochs, finetune_epochs)
    _checked_gradual(gradual_epochs, gradual_amount)
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"run_demo: out={str(folder)!r} is a file; expected a folder")
    folder.mkdir(parents=True, exist_ok=True)
    tick = progress or (lambda label, done, total: None)
    with _deterministic(seed):
        data = _digits(seed)
        model = DigitsCNN()
        _train(model, data, epochs, 2e-3, "training the dense model", tick)
        rows = [_measure("dense", model, data)]
        dense = copy.deepcopy(model)
        trained = copy.deepcopy(model)
        gradual = copy.deepcopy(model)
        overall = "pruning steps (+ fine-tuning)"
        tick(overall, 0, len(steps) + 1)
        for done, target in enumerate(steps, 1):
            _prune_to(model, target)
            label = f"global L1 {target:.0%}"
            _train(model, data, finetune_epochs, 1e-3, f"pruned to {target:.0%}, fine-tuning", tick)
            rows.append(_measure(label, model, data))
            tick(overall, done, len(steps) + 1)
        for module, name in dense.prunable()[:-1]:
            ln_structured(module, name, STRUCTURED_AMOUNT, n=2, dim=0)
        label = f"structured L2 {STRUCTURED_AMOUNT:.0%}"
        _train(dense, data, finetune_epochs, 1e-3, "structured, fine-tuning", tick)
        rows.append(_measure(label, dense, data))
        tick(overall, len(steps) + 1, len(steps) + 1)
        if gradual_epochs:
            rows.append(_gradual_run(gradual, data, gradual_epochs, gradual_amount, seed, tick))
        compacted = run_structured(trained, data, finetune_epochs, tick)
    final = report(model)
    files = _write(folder, model, final, rows, f"global L1 {steps[-1]:.0%}")
    return DemoResult(tuple(rows), final, files, len(data.y_test), compacted)


def _checked(sparsities: Sequence[float], epochs: int, finetune_epochs: int) -> list[float]:
    """The sparsities as an increasing list; every argument checked."""
    for name, value in (("epochs", epochs), ("finetune_epochs", finetune_epochs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"run_demo: invalid {name}={value!r}; expected an int >= 0")
    if not sparsities:
        raise ValueError("run_demo: sparsities is empty; expected fractions such as 0.5,0.75,0.9")
    for fraction in sparsities:
        validate_pruning_amount_init(fraction, owner="run_demo: sparsity")
        if not isinstance(fraction, float):
            raise ValueError(f"run_demo: invalid sparsity={fraction!r}; expected a float in [0, 1]")
    steps = list(sparsities)
    if steps != sorted(set(steps)):
        raise ValueError(
            f"run_demo: sparsities {steps} must increase: each step prunes further than the last"
        )
    return steps


@contextmanager
def _deterministic(seed: int) -> Iterator[None]:
    """Seed torch and use one thread (sums then add up the same way), restoring both after."""
    with torch_threads(1), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@dataclass(frozen=True)
class _Data:
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor


def _digits(seed: int) -> _Data:
    """The 8x8 digits scaled to [0, 1], split 75/25, stratified by class."""
    datasets = require("sklearn.datasets", "demo", "prunekit demo")
    selection = require("sklearn.model_selection", "demo", "prunekit demo")
    digits = datasets.load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    train, test = selection.train_test_split(
        list(range(len(y))), test_size=0.25, stratify=digits.target, random_state=seed
    )
    return _Data(x[train], y[train], x[test], y[test])


def _train(
    model: nn.Module,
    data: _Data,
    epochs: int,
    lr: float,
    label: str,
    tick: Progress,
    after_step: Callable[[], None] | None = None,
) -> None:
    """Adam on shuffled mini-batches; a pruned model trains its ``_orig`` tensors.
    `after_step` runs after each optimizer step (a GradualPruner's step)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    count = len(data.y_train)
    batches = -(-count // BATCH)
    total = epochs * batches
    tick(label, 0, total)
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(count)
        for i in range(batches):
            index = order[i * BATCH : (i + 1) * BATCH]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data.x_train[index]), data.y_train[index])
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            if after_step is not None:
                after_step()
            tick(label, epoch * batches + i + 1, total)


def _prune_to(model: DigitsCNN, target: float) -> None:
    """Global L1 over the prunable weights until `target` of them are pruned in all."""
    pairs = model.prunable()
    total = sum(getattr(m, n).numel() for m, n in pairs)
    masks = [m._buffers.get(mask_name(n)) for m, n in pairs]
    masked = sum(int(mask.eq(0).sum()) for mask in masks if mask is not None)
    global_unstructured(pairs, L1Unstructured, amount=max(round(target * total) - masked, 0))


def _measure(label: str, model: DigitsCNN, data: _Data) -> DemoRow:
    model.eval()
    with torch.no_grad():
        accuracy = float((model(data.x_test).argmax(1) == data.y_test).float().mean())
    full = report(model)
    weights = [full[f"{name}.weight"] for name in ("conv1", "conv2", "fc1", "fc2")]
    zeros = sum(r.zeros for r in weights)
    return DemoRow(
        model=label,
        sparsity=zeros / sum(r.numel for r in weights),
        accuracy=accuracy,
        nonzeros=full.nonzeros,
        params=full.numel,
        dense_bytes=full.dense_bytes,
        sparse_bytes=full.sparse_bytes,
    )


def _write(
    folder: Path, model: nn.Module, final: Report, rows: list[DemoRow], sparsest: str
) -> tuple[Path, ...]:
    checkpoint = folder / "pruned.pt"
    torch.save(model.state_dict(), checkpoint)
    report_json = folder / "report.json"
    report_json.write_text(final.to_json() + "\n")
    results = folder / "results.json"
    # standard JSON: a value that is not finite is null, named under its row's not_finite
    results.write_text(dumps([standard(asdict(r)) for r in rows]))
    accuracy_png = _plot_accuracy(rows, folder / "accuracy_vs_sparsity.png")
    layers_png = final.plot(
        folder / "sparsity_per_layer.png",
        title=f"Sparsity per tensor after {sparsest} (overall {final.sparsity:.1%})",
    )
    return (checkpoint, report_json, results, accuracy_png, layers_png)


def _plot_accuracy(rows: list[DemoRow], path: Path) -> Path:
    """Test accuracy against sparsity: the global L1 steps as a line, structured apart."""
    figure_mod = require("matplotlib.figure", "cli", "the demo's plots")
    fig = figure_mod.Figure(figsize=(6, 4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    steps = [r for r in rows if not r.model.startswith(("structured", "gradual"))]
    structured = next(r for r in rows if r.model.startswith("structured"))
    ax.plot(
        [100 * r.sparsity for r in steps],
        [100 * r.accuracy for r in steps],
        marker="o",
        label="global L1 (unstructured), fine-tuned",
    )
    for r in steps:
        ax.annotate(
            f"{100 * r.accuracy:.1f}%",
            (100 * r.sparsity, 100 * r.accuracy),
            textcoords="offset points",
            xytext=(0, 7),
            ha="center",
            fontsize=8,
        )
    ax.plot(
        [100 * structured.sparsity],
        [100 * structured.accuracy],
        marker="s",
        linestyle="none",
        label=structured.model + " (channels), fine-tuned",
    )
    ax.annotate(
        f"{100 * structured.accuracy:.1f}%",
        (100 * structured.sparsity, 100 * structured.accuracy),
        textcoords="offset points",
        xytext=(0, -14),
        ha="center",
        fontsize=8,
        color="C1",
    )
    for r in rows:
        if r.model.startswith("gradual"):
            _plot_gradual(ax, r)
    low = min(100 * r.accuracy for r in rows)
    ax.set_ylim(max(0.0, low - 5), 100.5)
    ax.set_xlim(-3, 103)
    ax.set_xlabel("sparsity of conv + linear weights (%)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Accuracy vs. sparsity, CNN on 8x8 digits")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.savefig(path, format="png")
    return path


# --- Structural pruning: prune channels, fine-tune while masked, compact, measure ---------------

COMPACT_AMOUNT = 0.5  # of the channels of every prunable group


@dataclass(frozen=True)
class StructuredRow:
    """One stage of the structured run."""

    model: str
    accuracy: float
    params: int
    dense_bytes: int
    macs: int
    latency_ms: float  # median of one forward over all test images, this CPU


@dataclass(frozen=True)
class StructuredResult:
    """The dense, masked and compacted models of the structured run, and what compact found."""

    rows: tuple[StructuredRow, ...]
    max_abs_diff: float

    def rich_table(self) -> Any:
        """The structured run as a ``rich.table.Table`` (needs the 'cli' extra)."""
        table_mod = require("rich.table", "cli", "the demo's table")
        table = table_mod.Table(
            title=f"Structural pruning: {COMPACT_AMOUNT:.0%} of the channels, compacted",
            caption="ms: latency, the median of one forward over the test images on this CPU, one "
            f"thread; compacted vs masked outputs: max |diff| {self.max_abs_diff:.1e}",
        )
        table.add_column("model", no_wrap=True)
        for name in ("test acc.", "params", "size", "MACs", "ms"):
            table.add_column(name, justify="right")
        for r in self.rows:
            table.add_row(r.model, f"{r.accuracy:.2%}", f"{r.params:,}", human_bytes(r.dense_bytes),
                          f"{r.macs:,}", f"{r.latency_ms:9.2f}")  # fmt: skip
        return table


def run_structured(model: DigitsCNN, data: _Data, epochs: int, tick: Progress) -> StructuredResult:
    """Mask whole channels of the trained `model`, fine-tune it masked, then compact it."""
    rows = [_structured_row("dense", model, data, count_macs, latency_ms)]
    prune_channels(model, data.x_train[:BATCH], COMPACT_AMOUNT)
    _train(model, data, epochs, 1e-3, "channels masked, fine-tuning", tick)
    rows.append(_structured_row("masked (fine-tuned)", model, data, count_macs, latency_ms))
    result = compact(model, data.x_test, latency_runs=0)
    rows.append(_structured_row("compacted", model, data, count_macs, latency_ms))
    return StructuredResult(tuple(rows), result.max_abs_diff)


def _structured_row(
    label: str, model: DigitsCNN, data: _Data, macs: Any, latency: Any
) -> StructuredRow:  # fmt: skip
    model.eval()
    with torch.no_grad():
        accuracy = float((model(data.x_test).argmax(1) == data.y_test).float().mean())
    found = report(model)
    per_image = macs(model, (data.x_test[:1],), {})
    return StructuredRow(label, accuracy, found.numel, found.dense_bytes, per_image,
                         latency(model, (data.x_test,), {}, 20))  # fmt: skip


# -- Gradual pruning: a copy of the dense model pruned while it trains -----------------------


def _checked_gradual(epochs: int, amount: float) -> None:
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"run_demo: invalid gradual_epochs={epochs!r}; expected an int >= 0")
    if isinstance(amount, bool) or not isinstance(amount, float) or not 0 <= amount <= 1:
        raise ValueError(f"run_demo: invalid gradual_amount={amount!r}; expected a float in [0, 1]")


def _gradual_run(
    model: DigitsCNN, data: _Data, epochs: int, amount: float, seed: int, tick: Progress
) -> DemoRow:
    """Train `epochs` more epochs while global L1 prunes to `amount` on the cubic schedule:
    from the first step to half-way, updated every 10 steps, then held. Seeded anew, so
    its numbers do not depend on the runs before it."""
    torch.manual_seed(seed)
    total = epochs * -(-len(data.y_train) // BATCH)
    pruner = GradualPruner(
        model,
        amount,
        start_step=0,
        end_step=total // 2,
        every=10,
        schedule="cubic",
        scope="global",
        include=[f"{m}.weight" for m in ("conv1", "conv2", "fc1", "fc2")],
    )
    label = f"gradual to {amount:.0%} (cubic), training"
    _train(model, data, epochs, 2e-3, label, tick, after_step=pruner.step)
    return _measure(f"gradual L1 {amount:.0%}", model, data)


def _plot_gradual(ax: Any, row: DemoRow) -> None:
    ax.plot(
        [100 * row.sparsity],
        [100 * row.accuracy],
        marker="D",
        linestyle="none",
        color="C2",
        label=row.model + " (cubic schedule, while training)",
    )
    ax.annotate(
        f"{100 * row.accuracy:.1f}%",
        (100 * row.sparsity, 100 * row.accuracy),
        textcoords="offset points",
        xytext=(0, -14),
        ha="center",
        fontsize=8,
        color="C2",
    )
