"""Digests of what ``prune_channels`` makes of a few small models, to compare two builds of
it: a rewrite of its stages must give the very same masks, weights, groups and reports, and
refuse bad arguments with the very same messages.

    PYTHONPATH=src python benchmarks/channels_digest.py --out new.json
    PYTHONPATH=/other/checkout/src python benchmarks/channels_digest.py --out old.json
    python benchmarks/channels_digest.py --compare old.json new.json

``channels_digest.json`` beside it holds the digests of main at 54d564a (before prune_channels
was split into stages), taken on this project's CI machine: compare a build against it with
``--compare benchmarks/channels_digest.json new.json``.

Each case (a CNN, BERT-tiny, LLaMA-tiny, Mixtral-tiny; amounts, heads, hidden, experts,
global scope, budgets of parameters, MACs and units with floors, calibrated criteria,
compensation and the refit) keeps a digest of every tensor of the model's state_dict after
the call (masks and the weights compensation writes, bit for bit), of the groups and units it
returned, and of the report's table where it is a ``BudgetReport``. Runs on one thread (torch's
kernels round differently across thread counts); latency budgets time the machine, so they
are left out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import prunekit
from helpers.scores_frozen import Convs

Case = tuple[nn.Module, Any, list[Any]]


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _tensor(value: Tensor) -> str:
    data = value.detach().cpu().contiguous().reshape(-1)
    raw = data.view(torch.uint8) if data.dtype != torch.bool else data.to(torch.uint8)
    header = f"{value.dtype}{tuple(value.shape)}".encode()
    return hashlib.sha256(header + raw.numpy().tobytes()).hexdigest()[:16]


def cnn() -> Case:
    torch.manual_seed(0)
    model = Convs().eval()
    with torch.no_grad():
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.running_mean.uniform_(-0.2, 0.2)
    batches = [torch.randn(2, 3, 6, 6), torch.randn(1, 3, 6, 6), torch.randn(2, 3, 6, 6)]
    return model, torch.randn(1, 3, 6, 6), batches


def mlp() -> Case:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 10), nn.GELU(),
                          nn.Linear(10, 4))  # fmt: skip
    batches = [torch.randn(5, 12), torch.randn(3, 12), torch.randn(7, 12)]
    return model, torch.randn(2, 12), batches


def _ids(vocab: int) -> list[Any]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(2):
        ids = torch.randint(0, vocab, (2, 7), generator=gen)
        out.append({"input_ids": ids, "labels": ids})
    return out


def bert() -> Case:
    import transformers as T

    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=48,
                          max_position_embeddings=32)  # fmt: skip
    model = T.BertModel(config).eval()
    batches = [{"input_ids": b["input_ids"]} for b in _ids(100)]
    return model, batches[0], batches


def llama() -> Case:
    from helpers.tiny_llm import llama as tiny

    model = tiny(vocab=100)
    batches = _ids(100)
    return model, {"input_ids": batches[0]["input_ids"]}, batches


def mixtral() -> Case:
    import transformers as T

    torch.manual_seed(0)
    config = T.MixtralConfig(vocab_size=100, max_position_embeddings=32, hidden_size=32,
                             intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, num_local_experts=4,
                             num_experts_per_tok=2)  # fmt: skip
    model = T.MixtralForCausalLM(config).eval()
    batches = _ids(100)
    return model, {"input_ids": batches[0]["input_ids"]}, batches


B = prunekit.Budget
# name -> (model, keywords of prune_channels; "calibration": True stands for the case's batches)
CASES: dict[str, tuple[Callable[[], Case], dict[str, Any]]] = {
    "cnn-l2": (cnn, {"amount": 0.5}),
    "cnn-l1-global": (cnn, {"amount": 0.4, "criterion": "l1", "scope": "global"}),
    "cnn-bn-round": (cnn, {"amount": 0.3, "criterion": "bn_scale", "round_to": 2}),
    "cnn-exclude": (cnn, {"amount": 0.5, "exclude": ["b"]}),
    "cnn-ignore": (cnn, {"amount": 0.5, "ignore": "c"}),
    "cnn-activation": (cnn, {"amount": 0.5, "criterion": "activation", "calibration": True}),
    "cnn-fluctuation": (cnn, {"amount": 0.5, "criterion": "fluctuation", "calibration": True}),
    "cnn-compensate": (cnn, {"amount": 0.5, "compensate": True, "calibration": True}),
    "cnn-reference": (cnn, {"amount": 0.5, "compensate": "reference", "calibration": True}),
    "cnn-budget-macs": (cnn, {"budget": B(macs=0.3)}),
    "cnn-budget-units": (cnn, {"budget": B(units=0.4, floor=0.25)}),
    "mlp-taylor": (
        mlp,
        {
            "amount": 0.5,
            "criterion": "taylor",
            "calibration": True,
            "loss": lambda out, batch: out.square().mean(),
        },
    ),
    "mlp-obs-damp": (
        mlp,
        {
            "amount": 0.5,
            "criterion": "obs",
            "calibration": True,
            "compensate": True,
            "damping": 0.1,
        },
    ),
    "mlp-callable": (mlp, {"amount": 0.5, "criterion": lambda g: torch.arange(g.size) % 3}),
    "bert-heads": (bert, {"amount": 0.25, "heads": 0.5}),
    "bert-hidden": (bert, {"hidden": 0.25, "criterion": "l1"}),
    "bert-activation": (
        bert,
        {"amount": 0.5, "heads": 0.25, "criterion": "activation", "calibration": True},
    ),
    "bert-budget": (bert, {"budget": B(params=0.2, kinds=("channels", "heads", "hidden"))}),
    "bert-compensate": (
        bert,
        {"amount": 0.5, "heads": 0.5, "compensate": True, "calibration": True},
    ),
    "llama-budget": (llama, {"budget": B(params=0.25)}),
    "llama-budget-floor": (llama, {"budget": B(macs=0.2, floor={"*mlp*": 0.5, "*": 0.2})}),
    "llama-group-heads": (llama, {"heads": 0.5, "gqa": "group", "amount": 0.25}),
    "llama-global": (llama, {"amount": 0.3, "heads": 0.5, "scope": "global"}),
    "llama-compensate": (
        llama,
        {
            "amount": 0.5,
            "heads": 0.5,
            "criterion": "activation",
            "calibration": True,
            "compensate": True,
        },
    ),
    "llama-auto": (
        llama,
        {"amount": 0.5, "compensate": True, "damping": "auto", "calibration": True},
    ),
    "llama-taylor": (llama, {"amount": 0.5, "criterion": "taylor", "calibration": True}),
    "mixtral-experts": (mixtral, {"experts": 0.5}),
    "mixtral-frequency": (mixtral, {"experts": 0.5, "criterion": "frequency", "calibration": True}),
    "mixtral-reap-global": (
        mixtral,
        {"experts": 0.5, "criterion": "reap", "scope": "global", "calibration": True},
    ),
    "mixtral-width": (mixtral, {"amount": 0.5, "heads": 0.5}),
}

# Bad calls: name -> (model, keywords); their errors' types and messages are kept verbatim.
BAD: dict[str, tuple[Callable[[], Case], dict[str, Any]]] = {
    "amount": (mlp, {"amount": 1.0}),
    "amount-int": (mlp, {"amount": 1}),
    "heads-bool": (mlp, {"heads": True}),
    "scope": (mlp, {"amount": 0.5, "scope": "model"}),
    "round_to": (mlp, {"amount": 0.5, "round_to": 0}),
    "gqa": (mlp, {"amount": 0.5, "gqa": "both"}),
    "budget-type": (mlp, {"budget": 0.2}),
    "budget-amount": (mlp, {"budget": B(params=0.2), "amount": 0.5}),
    "budget-scope": (mlp, {"budget": B(params=0.2), "scope": "global"}),
    "budget-unreachable": (mlp, {"budget": B(params=0.99)}),
    "compensate": (mlp, {"amount": 0.5, "compensate": "yes"}),
    "compensate-type": (mlp, {"amount": 0.5, "compensate": 1}),
    "compensate-no-data": (mlp, {"amount": 0.5, "compensate": True}),
    "damping-alone": (mlp, {"amount": 0.5, "damping": 0.1}),
    "damping-bad": (mlp, {"amount": 0.5, "damping": -1.0, "compensate": True, "calibration": True}),
    "criterion": (mlp, {"amount": 0.5, "criterion": "l3"}),
    "criterion-type": (mlp, {"amount": 0.5, "criterion": 3}),
    "criterion-needs-data": (mlp, {"amount": 0.5, "criterion": "activation"}),
    "criterion-no-data": (mlp, {"amount": 0.5, "criterion": "l2", "calibration": True}),
    "loss-alone": (mlp, {"amount": 0.5, "loss": lambda o, b: o.sum()}),
    "loss-wrong-criterion": (
        mlp,
        {
            "amount": 0.5,
            "criterion": "activation",
            "calibration": True,
            "loss": lambda o, b: o.sum(),
        },
    ),
    "exclude-missing": (mlp, {"amount": 0.5, "exclude": ["nothing*"]}),
    "exclude-type": (mlp, {"amount": 0.5, "exclude": [3]}),
    "exclude-foreign": (mlp, {"amount": 0.5, "exclude": [nn.Linear(1, 1)]}),
    "heads-none": (mlp, {"heads": 0.5}),
    "experts-none": (mlp, {"experts": 0.5}),
    "model": (lambda: (3, torch.zeros(1), []), {"amount": 0.5}),  # type: ignore[return-value,arg-type]
    "reap-on-channels": (mixtral, {"amount": 0.5, "criterion": "reap", "calibration": True}),
    "experts-too-many": (mixtral, {"experts": 0.9}),
}


def _keywords(options: dict[str, Any], batches: list[Any]) -> dict[str, Any]:
    found = dict(options)
    if found.get("calibration") is True:
        found["calibration"] = batches
    return found


def _groups(result: list[Any]) -> str:
    return _hash(repr([(p.group.name, p.group.kind, p.group.size, p.units) for p in result]))


def run_case(build: Callable[[], Case], options: dict[str, Any]) -> dict[str, Any]:
    model, example, batches = build()
    result = prunekit.prune_channels(model, example, **_keywords(options, batches))
    state = {k: _tensor(v) for k, v in model.state_dict().items()}
    found: dict[str, Any] = {"groups": _groups(result), "count": len(result)}
    found["state"] = _hash(json.dumps(state, sort_keys=True))
    found["masks"] = sum(1 for k in state if k.endswith("_mask"))
    if isinstance(result, prunekit.BudgetReport):
        found["report"] = _hash(str(result) + repr(result) + repr(result.rows))
    found["type"] = type(result).__name__
    return found


def run_bad(build: Callable[[], Case], options: dict[str, Any]) -> str:
    model, example, batches = build()
    try:
        prunekit.prune_channels(model, example, **_keywords(options, batches))
    except (ValueError, TypeError) as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def compute() -> dict[str, Any]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        found: dict[str, Any] = {}
        for name, (build, options) in CASES.items():
            found[name] = run_case(build, options)
            print(f"{name}: {found[name]}", flush=True)
        for name, (build, options) in BAD.items():
            found[f"bad:{name}"] = run_bad(build, options)
        return found
    finally:
        torch.set_num_threads(threads)


def compare(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Where the two differ, one line per case."""
    return [
        f"{name}: {old.get(name)!r} -> {new.get(name)!r}"
        for name in sorted(set(old) | set(new))
        if old.get(name) != new.get(name)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the digests here")
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    args = parser.parse_args()
    if args.compare:
        old, new = (json.loads(Path(p).read_text()) for p in args.compare)
        problems = compare(old, new)
        print("\n".join(problems) or f"all {len(new)} cases identical")
        sys.exit(1 if problems else 0)
    found = compute()
    if args.out:
        Path(args.out).write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
