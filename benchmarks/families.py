"""Every causal-LM family of the installed transformers, from a tiny random config: what the
channel graph finds, pruned, compacted, and checked against the masked model.

    python benchmarks/families.py                     # every family (make bench-families)
    python benchmarks/families.py --only llama,qwen3  # some of them

For each entry of transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: the family's config with
small widths (hidden 64, 2 layers, 8 heads of 8 over 2 key/value heads, MLP 96, vocabulary
128, 4 experts of 32 choosing 2, where the config has those fields), random init, eval mode.
Per family: built or not (the reason), the prunable groups by kind (heads, channels, hidden,
experts) and those left alone, then `prune_channels` with heads 25 %, MLP and other channels
30 %, hidden 25 % and experts 25 % (each only where such groups exist; widths kept multiples
of 4, as grouped_mm experts need 16-byte strides; `pruned` counts the units masked of each
kind, out of all of that kind), `compact` (its output
check: max |diff| / max |output|, compacted against masked, on the example ids), whether
greedy `generate()` of 6 tokens (KV cache) is the same before and after compaction, and
whether `save_pretrained` / `from_pretrained` gives back the compacted model's logits
(relative 1e-5; 'stale' where compaction said the config cannot express the model). The
note says why a family was not built, not compacted, or not pruned in every kind (heads,
MLP, hidden): the reason of its first group left alone. One process, one thread; a family
that takes longer than --timeout seconds is reported so.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import prunekit
from helpers.vision import define_torchvision_ops

SMALL: dict[str, Any] = {
    "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 96,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "num_experts": 4,
    "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "max_position_embeddings": 64, "n_embd": 64, "n_layer": 2, "n_head": 8, "n_inner": 96,
    "d_model": 64, "ffn_dim": 96, "n_positions": 64, "num_layers": 2, "num_heads": 8,
    "ffn_hidden_size": 96, "sliding_window": 16, "first_k_dense_replace": 1,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
SHARES = {"amount": 0.3, "heads": 0.25, "hidden": 0.25, "experts": 0.25}
MAX_PARAMS = 5_000_000


@dataclass
class Row:
    family: str
    built: str = ""
    found: dict[str, int] = field(default_factory=dict)
    left: int = 0
    pruned: str = ""
    check: float | None = None
    generate: str = ""
    reload: str = ""
    note: str = ""


def small_config(model_type: str) -> Any:
    from transformers import AutoConfig

    base = AutoConfig.for_model(model_type)
    accepted = set(inspect.signature(type(base).__init__).parameters)
    settings = {k: v for k, v in SMALL.items() if hasattr(base, k) or k in accepted}
    config = AutoConfig.for_model(model_type, **settings)
    for sub in ("text_config", "decoder"):
        inner = getattr(config, sub, None)
        if inner is not None and hasattr(inner, "to_dict"):
            for k, v in SMALL.items():
                if hasattr(inner, k):
                    setattr(inner, k, v)
    return config


def build(model_type: str, class_name: str) -> nn.Module:
    import transformers

    config = small_config(model_type)
    with torch.device("meta"):  # sized first: some defaults stay large
        sized: nn.Module = getattr(transformers, class_name)(config)
    count = sum(p.numel() for p in sized.parameters())
    if count > MAX_PARAMS:
        raise RuntimeError(f"{count:,} parameters from the small config")
    torch.manual_seed(0)
    model: nn.Module = getattr(transformers, class_name)(config)
    return model.eval()


def _why(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text[:110] + ("..." if len(text) > 110 else "")


def _generate(model: Any, ids: Tensor) -> Tensor | None:
    if not hasattr(model, "generate"):
        return None
    out: Tensor = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    return out


def measure(model_type: str, class_name: str) -> Row:
    row = Row(model_type)
    try:
        model = build(model_type, class_name)
    except BaseException as error:
        row.built = "no"
        row.note = _why(error)
        return row
    row.built = "yes"
    ids = torch.randint(1, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids}
    try:
        groups = prunekit.channel_groups(model, inputs)
    except BaseException as error:
        row.note = "channel_groups: " + _why(error)
        return row
    for g in groups:
        if g.prunable:
            row.found[g.kind] = row.found.get(g.kind, 0) + 1
    row.left = sum(1 for g in groups if not g.prunable)
    shares = {k: v for k, v in SHARES.items()
              if v and row.found.get("channels" if k == "amount" else k)}  # fmt: skip
    if not shares:
        row.note = next((g.reason or "" for g in groups if not g.prunable), "no groups")[:110]
        return row
    try:
        chosen = prunekit.prune_channels(model, inputs, **shares, round_to=4)
        row.pruned = _pruned(groups, chosen, shares)
        with torch.no_grad():
            masked = _generate(model, ids)
        report = prunekit.compact(model, inputs, latency_runs=0)
        row.check = report.relative_error
        with torch.no_grad():
            after = _generate(model, ids)
        if masked is not None and after is not None:
            row.generate = "equal" if torch.equal(masked, after) else "DIFFERS"
        row.reload = "stale" if report.stale else _reload(model, class_name, inputs)
        if report.stale:
            row.note = "stale: " + report.stale[0].removeprefix("a model built from the config ")
    except BaseException as error:
        row.note = _why(error)
        return row
    missing = [k for k in ("heads", "channels", "hidden") if k not in row.found]
    if missing:
        why = next((g.reason for g in groups if not g.prunable and g.reason
                    and g.reason != "they reach the model's output"), "none found")  # fmt: skip
        row.note = (f"no {'/'.join(missing)}: {why[:80]}" + (f"; {row.note}" if row.note
                    else ""))[:160]  # fmt: skip
    return row


def _logits(model: Any, inputs: dict[str, Tensor]) -> Tensor:
    with torch.no_grad():
        out = model(**inputs)
    found: Tensor = out.logits if hasattr(out, "logits") else out[0]
    return found


def _reload(model: Any, class_name: str, inputs: dict[str, Tensor]) -> str:
    import transformers

    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        again = getattr(transformers, class_name).from_pretrained(folder).eval()
    a, b = _logits(model, inputs), _logits(again, inputs)
    if a.shape != b.shape:
        return "DIFFERS"
    return "equal" if float((a - b).abs().max()) <= 1e-5 * float(a.abs().max()) else "DIFFERS"


def _pruned(groups: list[Any], chosen: list[Any], shares: dict[str, float]) -> str:
    parts = []
    for key in ("heads", "amount", "hidden", "experts"):
        if key not in shares:
            continue
        kind = "channels" if key == "amount" else key
        total = sum(g.size for g in groups if g.prunable and g.kind == kind)
        masked = sum(len(p.units) for p in chosen if p.group.kind == kind)
        parts.append(f"{'mlp' if key == 'amount' else key} {masked}/{total}")
    return " ".join(parts)


@contextlib.contextmanager
def time_limit(seconds: int) -> Any:
    def stop(*_: Any) -> None:
        raise TimeoutError(f"more than {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def render(rows: list[Row]) -> str:
    head = (
        f"{'family':<26} {'built':<5} {'heads':>5} {'chan':>5} {'hidden':>6} {'experts':>7} "
        f"{'left':>5}  {'pruned':<44} {'check':>8}  {'generate':<8} {'reload':<7} note"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        f = r.found
        check = "" if r.check is None else f"{r.check:.1e}"
        lines.append(
            f"{r.family:<26} {r.built:<5} {f.get('heads', 0):>5} {f.get('channels', 0):>5} "
            f"{f.get('hidden', 0):>6} {f.get('experts', 0):>7} {r.left:>5}  {r.pruned:<44} "
            f"{check:>8}  {r.generate:<8} {r.reload:<7} {r.note}"
        )
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    built = [r for r in rows if r.built == "yes"]
    exact = [r for r in built if r.check is not None and r.check <= 1e-4]
    full = [r for r in exact if {"heads", "hidden", "channels"} <= set(r.found)]
    gen = [r for r in exact if r.generate == "equal"]
    back = [r for r in exact if r.reload == "equal"]
    return (
        f"{len(rows)} families: {len(built)} built from a small config; compacted exactly "
        f"{len(exact)} (heads, MLP and hidden all pruned in {len(full)}); generate() equal "
        f"{len(gen)}; save_pretrained/from_pretrained equal {len(back)}"
    )


def sweep(
    description: str,
    measure: Callable[[str, str], Any],
    failed: Callable[[str, str], Any],
    render: Callable[[list[Any]], str],
    summary: Callable[[list[Any]], str],
) -> None:
    """Every causal-LM family of transformers through `measure` (model type, class name), each
    within --timeout seconds; a family that raises gets `failed`'s row (model type, why)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--only", help="comma-separated model types")
    parser.add_argument("--timeout", type=int, default=120)
    args = parser.parse_args()
    torch.set_num_threads(1)
    define_torchvision_ops()
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    wanted = set(args.only.split(",")) if args.only else None
    rows = []
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    for model_type, class_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if wanted is not None and model_type not in wanted:
            continue
        try:
            with time_limit(args.timeout):
                row = measure(model_type, class_name)
        except TimeoutError as error:
            row = failed(model_type, _why(error))
        except Exception:
            row = failed(model_type, traceback.format_exc(limit=1)[-110:])
        rows.append(row)
        print(render([row]).splitlines()[-1], flush=True)
    print()
    print(render(rows))
    print(summary(rows))


def main() -> None:
    sweep(__doc__.splitlines()[0], measure, lambda kind, why: Row(kind, built="?", note=why),
          render, summary)  # fmt: skip


if __name__ == "__main__":
    main()
