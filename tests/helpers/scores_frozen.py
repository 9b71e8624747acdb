"""Frozen group scores: every built-in group criterion's scores on a few small models,
written once by a known-good build and compared by test_scores_frozen.py, so a change in how
the criteria's statistics are gathered or reduced must give the same scores.

    PYTHONPATH=src python tests/helpers/scores_frozen.py   # rewrite scores_frozen.json

Each (model, criterion) keeps, per group, its scores as float64 values (JSON keeps every bit).
They are compared within `RTOL`, not bit for bit: torch's float32 kernels round differently
from one CPU to another (AVX-512 or not) and from one thread count to another, so the same
build gives scores that differ in their last bits across machines. Scores are computed on one
thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import prunekit
from prunekit.structure.scoring.criteria import score_groups

FILE = Path(__file__).with_name("scores_frozen.json")


class Convs(nn.Module):
    """A convolution with batch norm, a grouped and a depthwise one, and a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.b = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.c = nn.Conv2d(8, 6, 1)
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.bn(self.a(x)))
        x = torch.relu(self.dw(torch.relu(self.b(x))))
        return self.head(torch.relu(self.c(x)).mean((2, 3)))


def _squares(output: Any, batch: Any) -> Tensor:
    value: Tensor = output.float().square().mean()
    return value


Case = tuple[nn.Module, Any, list[Any], Callable[[Any, Any], Tensor] | None, str]


def mlp_case() -> Case:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 10), nn.GELU(), nn.Linear(10, 4)
    )
    batches = [torch.randn(5, 12), torch.randn(3, 12), torch.randn(7, 12)]
    return model, torch.randn(2, 12), batches, _squares, "query"


def convs_case() -> Case:
    torch.manual_seed(0)
    model = Convs().eval()
    with torch.no_grad():  # a batch norm that is not the identity
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.running_mean.uniform_(-0.2, 0.2)
    batches = [torch.randn(2, 3, 6, 6), torch.randn(1, 3, 6, 6)]
    return model, torch.randn(1, 3, 6, 6), batches, _squares, "query"


def hf_case(name: str) -> Case:
    import transformers as T  # an optional dependency, for these cases only

    torch.manual_seed(0)
    small = dict(vocab_size=100, max_position_embeddings=32)
    if name == "llama":
        config: Any = T.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=2,
                                    **small)  # fmt: skip
        model: nn.Module = T.LlamaForCausalLM(config).eval()
    else:
        config = T.MixtralConfig(hidden_size=32, intermediate_size=16, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 num_local_experts=4, num_experts_per_tok=2, **small)  # fmt: skip
        model = T.MixtralForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(2):
        ids = torch.randint(0, 100, (2, 7), generator=gen)
        batches.append({"input_ids": ids, "labels": ids})
    example = {"input_ids": batches[0]["input_ids"]}
    return model, example, batches, None, "group" if name == "llama" else "query"


CASES: dict[str, Callable[[], Case]] = {
    "mlp": mlp_case,
    "convs": convs_case,
    "llama": lambda: hf_case("llama"),
    "mixtral": lambda: hf_case("mixtral"),
}

# criterion -> (name given to score_groups, with calibration batches, with the case's loss)
CRITERIA: dict[str, tuple[str, bool, bool]] = {
    "l1": ("l1", False, False),
    "l2": ("l2", False, False),
    "bn_scale": ("bn_scale", False, False),
    "taylor_grad": ("taylor", False, False),
    "taylor_batches": ("taylor", True, True),
    "activation": ("activation", True, False),
    "obs": ("obs", True, False),
    "fluctuation": ("fluctuation", True, False),
    "frequency": ("frequency", True, False),
    "reap": ("reap", True, False),
}


# How far a score may move (relative to the largest of its group) and still be the same. The
# same build moves 'obs' on the convolutions by 2.5e-5 between 1 and 2 threads (a solve
# amplifies float32 roundings); a changed statistic, damping or reduction moves scores by
# far more than this.
RTOL = 1e-3

Found = dict[str, list[tuple[str, list[float]]]]  # criterion -> [(group, scores)]


def values(scores: Tensor) -> list[float]:
    """The scores as Python floats (float64, every bit kept by JSON)."""
    found: list[float] = scores.detach().to(torch.float64).tolist()
    return found


def differences(found: list[float], frozen: list[float]) -> str | None:
    """Why `found` is not the same scores as `frozen` (None: it is). NaN is a difference."""
    if len(found) != len(frozen):
        return f"{len(found)} scores, {len(frozen)} frozen"
    a = torch.tensor(found, dtype=torch.float64)
    b = torch.tensor(frozen, dtype=torch.float64)
    scale = float(b.abs().max()) if b.numel() else 0.0
    gap = (a - b).abs()
    bad = ~(gap <= RTOL * scale)  # NaN compares False: a difference
    if not bool(bad.any()):
        return None
    worst = int(torch.nan_to_num(gap, nan=float("inf")).argmax())
    return f"score {worst}: {found[worst]!r} where {frozen[worst]!r} was frozen"


def _backward(
    model: nn.Module, batches: list[Any], loss: Callable[[Any, Any], Tensor] | None
) -> None:
    """Gradients in ``.grad`` from one backward on the first batch, for 'taylor' from .grad."""
    batch = batches[0]
    output = model(**batch) if isinstance(batch, dict) else model(batch)
    value = output.loss if loss is None else loss(output, batch)
    value.backward()


def compute(name: str) -> Found:
    """criterion -> [(group name, its scores)] for each group it ranks, computed on
    one thread (torch's own convolution gradients differ in the last bits between thread
    counts)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _compute(name)
    finally:
        torch.set_num_threads(threads)


def _compute(name: str) -> Found:
    found: Found = {}
    for label, (criterion, calibrated, with_loss) in CRITERIA.items():
        model, example, batches, loss, gqa = CASES[name]()
        groups = [g for g in prunekit.channel_groups(model, example, gqa=gqa) if g.prunable]
        experts = [g for g in groups if g.kind == "experts"]
        if criterion in ("frequency", "reap"):
            groups = experts
        else:
            groups = [g for g in groups if g.kind != "experts"]
        if not groups:
            continue
        if label == "taylor_grad":
            _backward(model, batches, loss)
        scores = score_groups(
            model,
            groups,
            criterion,
            batches if calibrated else None,
            loss if with_loss else None,
        )
        found[label] = [(g.name, values(s)) for g, s in zip(groups, scores, strict=True)]
    return found


def dumps(found: dict[str, Found]) -> str:
    """The JSON, one line per (model, criterion)."""
    models = []
    for name, entry in found.items():
        rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in entry.items())
        models.append(f"{json.dumps(name)}: {{\n{rows}\n}}")
    return "{\n" + ",\n".join(models) + "\n}\n"


def main() -> None:
    found = {name: compute(name) for name in CASES}
    FILE.write_text(dumps(found))
    print(f"wrote {FILE}: {sum(len(v) for v in found.values())} (model, criterion) pairs")


if __name__ == "__main__":
    main()
