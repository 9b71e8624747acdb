"""Latency probes for ``Budget(latency=...)``: time a model against its compacted self.

A probe masks given units, compacts the model, times the model as it was and the compacted
one alternately on the example inputs (``paired_latency``), and puts the model back exactly
as it was (one ``Transaction`` rolled back): parameters, attributes, hooks and config. Both
states are in memory during the probe (the compacted tensors are new ones).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from prunekit.core.transaction import Transaction
from prunekit.structure.compaction.compact import compact
from prunekit.structure.graph.graph import split_inputs
from prunekit.structure.measure import Paired, paired_latency
from prunekit.structure.pruned import PrunedGroup

Probe = Callable[[list[PrunedGroup]], Paired]
"""Times the model without and with the given units removed (before: the model as it is)."""


def latency_probe(
    model: nn.Module,
    example_inputs: Any,
    runs: int,
    install: Callable[[nn.Module, list[PrunedGroup]], None],
) -> Probe:
    """A probe of `model` on `example_inputs`, `runs` alternated pairs per call; `install`
    masks the units (as ``prune_channels`` does)."""
    args, kwargs = split_inputs(example_inputs, "prune_channels")

    def forward() -> None:
        with torch.inference_mode():
            model(*args, **kwargs)

    def timed(chosen: list[PrunedGroup]) -> Paired:
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        dense = Transaction(model)
        try:
            install(model, chosen)
            with warnings.catch_warnings():  # what compact would say of a saved copy
                warnings.simplefilter("ignore")
                # values are not compared: only the shapes and the time matter here
                compact(model, example_inputs, tolerance=math.inf, latency_runs=0)
            compacted = Transaction(model)

            def to_dense() -> None:
                dense.rollback()

            def to_compacted() -> None:
                compacted.rollback()

            return paired_latency(to_dense, to_compacted, forward, runs)
        finally:
            dense.rollback()
            for m, mode in modes:
                m.training = mode

    return timed
