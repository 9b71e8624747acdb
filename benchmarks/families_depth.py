"""Every causal-LM family of the installed transformers, from a tiny random config with four
layers: one block removed, checked, saved and reloaded.

    python benchmarks/families_depth.py                     # every family
    python benchmarks/families_depth.py --only llama,qwen3  # some of them

(make bench-families-depth runs the first.)

For each entry of transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: the family's config with
the small widths of benchmarks/families.py but four layers, random init, eval mode. Block 1
is skipped (``skip_blocks``) and removed (``remove_blocks``, which checks the model against
the skipped one on the example ids and a model built from the rewritten config against the
old one); then ``save_pretrained`` / ``from_pretrained`` must give back the logits of the
model with the block removed (relative 1e-5), and those of the skipped model. Per family:
built or not (and whether its forward runs at all), removed or refused (the refusal's
reason), the config fields rewritten, the output check of ``remove_blocks`` (max |diff| /
max |output|), and the reload. One process, one thread; a family that takes longer than
--timeout seconds is reported so.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prunekit
from families import SMALL, small_config, sweep

LAYERS = 4
REMOVED = 1
MAX_PARAMS = 20_000_000  # four layers of the families' small widths (DeepSeek's: 15 M)


@dataclass
class Row:
    family: str
    built: str = ""
    removed: str = ""
    check: float | None = None
    reload: str = ""
    config: str = ""
    note: str = ""


def build(model_type: str, class_name: str) -> nn.Module:
    import transformers

    deep = {k: LAYERS for k in ("num_hidden_layers", "n_layer", "num_layers")}
    saved = dict(SMALL)
    SMALL.update(deep)
    try:
        config = small_config(model_type)
    finally:
        SMALL.clear()
        SMALL.update(saved)
    with torch.device("meta"):
        sized: nn.Module = getattr(transformers, class_name)(config)
    count = sum(p.numel() for p in sized.parameters())
    if count > MAX_PARAMS:
        raise RuntimeError(f"{count:,} parameters from the small config")
    torch.manual_seed(0)
    model: nn.Module = getattr(transformers, class_name)(config)
    return model.eval()


def _why(error: BaseException, width: int = 150) -> str:
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text[:width] + ("..." if len(text) > width else "")


def _logits(model: Any, inputs: dict[str, Tensor]) -> Tensor:
    with torch.no_grad():
        out = model(**inputs)
    found: Tensor = out.logits if hasattr(out, "logits") else out[0]
    return found


def _equal(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and bool((a - b).abs().max() <= 1e-5 * a.abs().max())


def measure(model_type: str, class_name: str) -> Row:
    import transformers

    row = Row(model_type)
    try:
        model = build(model_type, class_name)
    except BaseException as error:
        row.built, row.note = "no", _why(error)
        return row
    row.built = "yes"
    ids = torch.randint(1, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids}
    try:
        _logits(model, inputs)
    except BaseException as error:
        row.removed, row.note = "-", "its forward fails before any removal: " + _why(error)
        return row
    try:
        prunekit.skip_blocks(model, [REMOVED])
        skipped = _logits(model, inputs)
        report = prunekit.remove_blocks(model, example_inputs=inputs)
    except BaseException as error:
        row.removed, row.note = "refused", _why(error)
        return row
    row.removed = "yes"
    row.check = (report.max_abs_diff or 0.0) / (report.max_abs_output or 1.0)
    row.config = ",".join(k for k in report.config if k != "num_hidden_layers")
    try:
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            again = getattr(transformers, class_name).from_pretrained(folder).eval()
        a, b = _logits(model, inputs), _logits(again, inputs)
        row.reload = "equal" if _equal(a, b) and _equal(skipped, b) else "DIFFERS"
    except BaseException as error:
        row.reload, row.note = "error", _why(error)
    return row


def render(rows: list[Row]) -> str:
    head = (
        f"{'family':<26} {'built':<5} {'removed':<8} {'check':>8}  {'reload':<8} "
        f"{'config':<30} note"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        check = "" if r.check is None else f"{r.check:.1e}"
        lines.append(
            f"{r.family:<26} {r.built:<5} {r.removed:<8} {check:>8}  {r.reload:<8} "
            f"{r.config[:30]:<30} {r.note}"
        )
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    built = [r for r in rows if r.built == "yes"]
    removed = [r for r in built if r.removed == "yes"]
    refused = [r for r in built if r.removed == "refused"]
    ran = [r for r in built if r.removed != "-"]
    back = [r for r in removed if r.reload == "equal"]
    wrong = [r for r in removed if r.reload != "equal"]
    return (
        f"{len(rows)} families: {len(built)} built from a small config with {LAYERS} layers, "
        f"{len(ran)} of them run; block {REMOVED} removed and checked in {len(removed)}, "
        f"refused (with the reason) in {len(refused)}; save_pretrained/from_pretrained equal "
        f"in {len(back)}, not in {len(wrong)}"
        + (f" ({', '.join(r.family for r in wrong)})" if wrong else "")
    )


def main() -> None:
    sweep(__doc__.splitlines()[0], measure, lambda kind, why: Row(kind, built="?", note=why),
          render, summary)  # fmt: skip


if __name__ == "__main__":
    main()
