"""Hostile inputs against the entry points added since the core: every call must fail with a
clear error and leave the model (tensors bit for bit, buffers, hooks, classes, attributes,
config) or the files exactly as they were.

Each case is one parametrized test; a case marked xfail is one that does not hold yet (the
reason says what happens), so the counts of cases tried and held are those of the report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import prunekit
from prunekit.tools.cli import main

st = pytest.importorskip("safetensors.torch")

X = torch.randn(4, 6)


class Net(nn.Module):
    """Conv-free MLP with a norm, a counter written in place and a config-like attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.c(torch.relu(self.b(self.norm(self.a(x)))))


def fingerprint(model: nn.Module) -> Any:
    """Everything a failed call must leave alone, as comparable values (bytes for tensors)."""
    tensors = {
        k: (
            v.dtype,
            tuple(v.shape),
            v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(),
        )
        for k, v in model.state_dict(keep_vars=True).items()
    }
    modules = []
    for name, m in model.named_modules():
        plain = {k: v for k, v in vars(m).items() if isinstance(v, int | float | str | bool)}
        hooks = {
            key: [(k, id(h)) for k, h in value.items()]
            for key, value in vars(m).items()
            if key.endswith("_hooks") and isinstance(value, dict)
        }
        params = [(k, id(v)) for k, v in m._parameters.items()]
        buffers = [(k, id(v)) for k, v in m._buffers.items()]
        modules.append((name, type(m), plain, hooks, params, buffers))
    config = getattr(model, "config", None)
    return tensors, modules, config.to_dict() if hasattr(config, "to_dict") else None


def files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_fifo()
    }


def masked_net() -> Net:
    model = Net()
    prunekit.prune_channels(model, X, 0.5)
    return model


def gradual(model: Net) -> prunekit.GradualPruner:
    pruner = prunekit.GradualPruner(model, 0.5, start_step=1, end_step=3, seed=0)
    pruner.step()
    pruner.step()
    return pruner


def _raise(*args: Any) -> Any:
    raise ArithmeticError("the user's function")


def _wrong_shape(group: Any) -> torch.Tensor:
    return torch.zeros(1000)


def _nan_weight(model: Net) -> Net:
    with torch.no_grad():
        model.b.weight[0, 0] = float("nan")  # b's outputs are a channel group prune_channels ranks
    return model


# (label, model factory, call on the model, accepted error types)
ModelCase = tuple[str, Callable[[], nn.Module], Callable[[Any], Any], Any]
E = (ValueError, TypeError, RuntimeError, KeyError, ArithmeticError, IndexError)

MODEL_CASES: list[ModelCase] = []


def _shown(value: Any) -> str:
    """A value as a test id: a function by its name (its repr holds an address, which
    differs between pytest-xdist's workers)."""
    return str(value.__name__) if callable(value) else repr(value)


def case(label: str, make: Callable[[], nn.Module], call: Callable[[Any], Any],
         errors: Any = E) -> None:  # fmt: skip
    MODEL_CASES.append((label, make, call, errors))


# prune_channels
for bad in (-0.1, 1.5, float("nan"), float("inf"), "x", True, None, [0.5]):
    case(f"prune_channels amount={bad!r}", Net, lambda m, a=bad: prunekit.prune_channels(m, X, a))
for key, bad in (("scope", "x"), ("round_to", 0), ("round_to", 1.5), ("heads", 2.0),
                 ("hidden", -1.0), ("criterion", "nope"), ("gqa", "x"),
                 ("criterion", _wrong_shape), ("criterion", _raise),
                 ("criterion", "activation"), ("calibration", [torch.ones(2, 7)])):  # fmt: skip
    case(f"prune_channels {key}={_shown(bad)}", Net,
         lambda m, k=key, b=bad: prunekit.prune_channels(m, X, 0.5, **{k: b}))  # fmt: skip
case("prune_channels taylor loss raises", Net,
     lambda m: prunekit.prune_channels(m, X, 0.5, criterion="taylor", calibration=[X],
                                       loss=_raise))  # fmt: skip
case("prune_channels taylor loss not scalar", Net,
     lambda m: prunekit.prune_channels(m, X, 0.5, criterion="taylor", calibration=[X],
                                       loss=lambda out, b: out))  # fmt: skip
for bad_x in (torch.ones(4, 7), "x", None, torch.ones(4, 6, dtype=torch.long)):
    case(f"prune_channels inputs={type(bad_x).__name__}", Net,
         lambda m, x=bad_x: prunekit.prune_channels(m, x, 0.5))  # fmt: skip
case("prune_channels on NaN weights", lambda: _nan_weight(Net()),
     lambda m: prunekit.prune_channels(m, X, 0.5))  # fmt: skip

# compact
for key, bad in (("tolerance", -1.0), ("tolerance", float("nan")), ("tolerance", "x"),
                 ("latency_runs", "x"), ("latency_runs", -1), ("latency_runs", 1.5)):  # fmt: skip
    case(f"compact {key}={bad!r}", masked_net,
         lambda m, k=key, b=bad: prunekit.compact(m, X, **{k: b}))  # fmt: skip
for bad_x in (torch.ones(4, 7), "x", None):
    case(f"compact inputs={type(bad_x).__name__}", masked_net,
         lambda m, x=bad_x: prunekit.compact(m, x, latency_runs=0))  # fmt: skip
case("compact tolerance=0 on a changed output", masked_net,
     lambda m: prunekit.compact(m, X * 1e30, tolerance=0.0, latency_runs=0))  # fmt: skip

# calibrated prune_model
for method in ("wanda", "sparsegpt", "taylor"):
    for label, kw in (("no calibration", {}), ("empty calibration", {"calibration": []}),
                      ("a bad batch", {"calibration": [X, torch.ones(2, 7)]}),
                      ("a string batch", {"calibration": ["x"]}),
                      ("amount nan", {"calibration": [X], "amount": float("nan")}),
                      ("pattern 3:2", {"calibration": [X], "pattern": "3:2"}),
                      ("scope x", {"calibration": [X], "scope": "x"}),
                      ("sequential x", {"calibration": [X], "sequential": "x"})):  # fmt: skip
        case(f"prune_model {method} {label}", Net,
             lambda m, me=method, k=kw: prunekit.prune_model(
                 m, k.get("amount", 0.5), method=me,
                 **{a: v for a, v in k.items() if a != "amount"}))  # fmt: skip
case(
    "prune_model taylor loss raises",
    Net,
    lambda m: prunekit.prune_model(m, 0.5, method="taylor", calibration=[X], loss=_raise),
)
case("prune_model taylor loss not scalar", Net,
     lambda m: prunekit.prune_model(m, 0.5, method="taylor", calibration=[X],
                                    loss=lambda out, b: out))  # fmt: skip
case("prune_model sparsegpt global", Net,
     lambda m: prunekit.prune_model(m, 0.5, method="sparsegpt", calibration=[X],
                                    scope="global"))  # fmt: skip
case("prune_model wanda on NaN weights", lambda: _nan_weight(Net()),
     lambda m: prunekit.prune_model(m, 0.5, method="wanda", calibration=[X]))  # fmt: skip
case(
    "prune_model wanda include nothing",
    Net,
    lambda m: prunekit.prune_model(m, 0.5, method="wanda", calibration=[X], include="zz*"),
)

# GradualPruner on a pruner mid-run (made and stepped before the model is compared)
PRUNERS: dict[int, tuple[prunekit.GradualPruner, dict[str, Any]]] = {}


def stepped() -> Net:
    model = Net()
    early = {k: v.clone() for k, v in model.state_dict().items()}
    PRUNERS[id(model)] = (gradual(model), early)
    with torch.no_grad():  # training moved the weights since `early`
        model.a.weight_orig.add_(1.0)
    return model


def pruner_of(model: Net) -> prunekit.GradualPruner:
    return PRUNERS[id(model)][0]


for label, change in (("not a mapping", lambda s: 3), ("no masks", lambda s: {**s, "masks": 3}),
                      ("generator of 3 bytes",
                       lambda s: {**s, "generator": torch.zeros(3, dtype=torch.uint8)}),
                      ("steps -1", lambda s: {**s, "steps": -1}),
                      ("amount nan", lambda s: {**s, "amount": float("nan")}),
                      ("mask of another shape",
                       lambda s: {**s, "masks": {k: torch.ones(2) for k in s["masks"]}}),
                      ("version 99", lambda s: {**s, "version": 99})):  # fmt: skip
    case(
        f"GradualPruner.load_state_dict {label}",
        stepped,
        lambda m, c=change: pruner_of(m).load_state_dict(c(pruner_of(m).state_dict())),
    )

for label, change in (("missing key", lambda s: {k: v for k, v in s.items() if k != "c.bias"}),
                      ("extra key", lambda s: {**s, "z": torch.ones(1)}),
                      ("misshapen", lambda s: {**s, "c.bias": torch.ones(9)}),
                      ("not a tensor", lambda s: {**s, "c.bias": 3})):  # fmt: skip
    case(
        f"GradualPruner.rewind {label}",
        stepped,
        lambda m, c=change: pruner_of(m).rewind(c(dict(PRUNERS[id(m)][1]))),
    )


def nan_stepped() -> Net:
    model = stepped()
    with torch.no_grad():
        model.a.weight_orig.fill_(float("nan"))
    return model


case("GradualPruner.step on NaN", nan_stepped, lambda m: pruner_of(m).step())


@pytest.mark.parametrize(
    ("label", "make", "call", "errors"), MODEL_CASES, ids=[c[0] for c in MODEL_CASES]
)
def test_a_failed_call_leaves_the_model_as_it_was(
    label: str, make: Callable[[], nn.Module], call: Callable[[Any], Any], errors: Any
) -> None:
    model = make()
    before = fingerprint(model)
    pruner = PRUNERS.get(id(model), (None, None))[0]
    steps = None if pruner is None else (pruner.steps, pruner.amount)
    try:
        call(model)
    except errors as error:
        assert str(error), label
        assert fingerprint(model) == before, label
        if pruner is not None:
            assert (pruner.steps, pruner.amount) == steps, label
        return
    finally:
        PRUNERS.pop(id(model), None)
    pytest.fail(f"{label}: no error")


def test_gradual_failures_leave_model_and_pruner_as_they_were() -> None:
    """The GradualPruner cases again, compared right before the failing call."""
    model = Net()
    pruner = gradual(model)
    state = pruner.state_dict()
    before, steps = fingerprint(model), pruner.steps
    bad = [
        {**state, "generator": torch.zeros(3, dtype=torch.uint8)},
        {**state, "masks": {k: torch.ones(2) for k in state["masks"]}},
        {**state, "amount": float("nan")},
    ]
    for one in bad:
        with pytest.raises((ValueError, TypeError)):
            pruner.load_state_dict(one)
        assert fingerprint(model) == before and pruner.steps == steps
    early = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.a.weight_orig.add_(1.0)
    before = fingerprint(model)
    for change in ({"c.bias": torch.ones(9)}, {"z": torch.ones(1)}):
        with pytest.raises(RuntimeError):
            pruner.rewind({**early, **change})
        assert fingerprint(model) == before
    with torch.no_grad():
        model.a.weight_orig.fill_(float("nan"))
    before = fingerprint(model)
    with pytest.raises(ValueError):
        pruner.step()
    assert fingerprint(model) == before and pruner.steps == steps


# -- files: save_compacted / load_compacted, prune_sharded, the CLI ----------------------------


def _saved(tmp: Path) -> Path:
    prunekit.save_compacted(Net(), tmp / "s")
    return tmp / "s"


def _edit_manifest(folder: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    where = folder / "compacted.json"
    where.write_text(json.dumps(change(json.loads(where.read_text()))))


def _set(d: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    d[key] = value
    return d


LOAD_CASES: list[Any] = [
    ("no manifest", lambda f: (f / "compacted.json").unlink()),
    ("manifest not json", lambda f: (f / "compacted.json").write_text("{")),
    ("manifest a list", lambda f: (f / "compacted.json").write_text("[]")),
    ("version 2", lambda f: _edit_manifest(f, lambda m: _set(m, "version", 2))),
    ("weights elsewhere", lambda f: _edit_manifest(f, lambda m: _set(m, "weights", "../x"))),
    ("modules a list", lambda f: _edit_manifest(f, lambda m: _set(m, "modules", []))),
    ("module missing", lambda f: _edit_manifest(f, lambda m: m["modules"].pop("b") and m)),
    ("config a list", lambda f: _edit_manifest(f, lambda m: _set(m, "config", [1]))),
    ("attribute forward", lambda f: _edit_manifest(
        f, lambda m: m["modules"]["a"]["attributes"].update(forward=3) or m)),
    ("attribute training", lambda f: _edit_manifest(
        f, lambda m: m["modules"]["a"]["attributes"].update(training=0) or m)),
    ("width a string", lambda f: _edit_manifest(
        f, lambda m: m["modules"]["a"]["attributes"].update(in_features="abc") or m)),
    ("width wrong", lambda f: _edit_manifest(
        f, lambda m: m["modules"]["a"]["attributes"].update(out_features=5) or m)),
    ("tensor shape strings", lambda f: _edit_manifest(
        f, lambda m: m["modules"]["a"]["tensors"]["weight"].update(shape=["x"]) or m)),
    ("weights truncated", lambda f: (f / "compacted.safetensors").write_bytes(
        (f / "compacted.safetensors").read_bytes()[:50])),
    ("weights a FIFO", lambda f: ((f / "compacted.safetensors").unlink(),
                                  os.mkfifo(f / "compacted.safetensors"))),
]  # fmt: skip


@pytest.mark.parametrize(("label", "spoil"), LOAD_CASES)
def test_load_compacted_refuses_a_spoiled_save(
    tmp_path: Path, label: str, spoil: Callable[[Path], Any]
) -> None:
    folder = _saved(tmp_path)
    spoil(folder)
    fresh = Net()
    before, on_disk = fingerprint(fresh), files(folder)
    with pytest.raises((ValueError, FileNotFoundError, RuntimeError, OSError)) as caught:
        prunekit.load_compacted(fresh, folder)
    assert not isinstance(caught.value, AttributeError)
    assert fingerprint(fresh) == before and files(folder) == on_disk
    with pytest.raises((ValueError, FileNotFoundError, RuntimeError, OSError)) as caught:
        prunekit.load_compacted(folder, factory=lambda config: Net())  # the folder alone
    assert not isinstance(caught.value, AttributeError)
    assert files(folder) == on_disk


def test_save_compacted_onto_a_file_and_into_a_read_only_folder(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError):
        prunekit.save_compacted(Net(), tmp_path / "f")
    assert (tmp_path / "f").read_text() == "x"
    folder = _saved(tmp_path)
    on_disk = files(folder)
    model = Net()
    model.a.weight = nn.Parameter(torch.ones(8, 6).to_sparse())  # not savable
    with pytest.raises((ValueError, RuntimeError, TypeError)):
        prunekit.save_compacted(model, folder)
    assert files(folder) == on_disk
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "s"]


def write_sharded(folder: Path) -> Path:
    folder.mkdir()
    parts = {"model-1.safetensors": {"a.weight": torch.randn(8, 6), "a.bias": torch.randn(8)},
             "model-2.safetensors": {"b.weight": torch.randn(4, 8)}}  # fmt: skip
    weight_map = {}
    for file, tensors in parts.items():
        st.save_file(tensors, str(folder / file))
        weight_map.update(dict.fromkeys(tensors, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


SHARDED_CASES: list[tuple[str, dict[str, Any], Callable[[Path], Any] | None]] = [
    ("method x", {"method": "x"}, None),
    ("amount nan", {"amount": float("nan")}, None),
    ("amount -1", {"amount": -1.0}, None),
    ("amount too many", {"amount": 10**6}, None),
    ("n for l1", {"n": 2}, None),
    ("ln global", {"method": "ln", "global_pruning": True}, None),
    ("output is input", {"out": "ckpt"}, None),
    ("output inside input", {"out": "ckpt/sub"}, None),
    ("output holds input", {"out": "."}, None),
    ("output through a link", {"out": "alias"}, lambda t: (t / "alias").symlink_to(t / "ckpt")),
    ("shard a FIFO", {}, lambda t: ((t / "ckpt/model-2.safetensors").unlink(),
                                    os.mkfifo(t / "ckpt/model-2.safetensors"))),
    ("shard truncated", {}, lambda t: (t / "ckpt/model-2.safetensors").write_bytes(b"12")),
    ("index not json", {}, lambda t: (t / "ckpt/model.safetensors.index.json").write_text("{")),
    ("index names a path", {}, lambda t: (t / "ckpt/model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a.weight": "../x.safetensors"}}))),
    ("NaN global", {"global_pruning": True}, lambda t: st.save_file(
        {"b.weight": torch.full((4, 8), float("nan"))}, str(t / "ckpt/model-2.safetensors"))),
    ("output a file", {"out": "file"}, lambda t: (t / "file").write_text("x")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("label", "options", "spoil"), SHARDED_CASES, ids=[c[0] for c in SHARDED_CASES]
)
def test_prune_sharded_fails_leaving_every_file(
    tmp_path: Path, label: str, options: dict[str, Any], spoil: Callable[[Path], Any] | None
) -> None:
    write_sharded(tmp_path / "ckpt")
    out = tmp_path / "out"
    prunekit.prune_sharded(tmp_path / "ckpt", out, 0.25, method="l1")  # an earlier output
    if spoil is not None:
        spoil(tmp_path)
    options = dict(options)
    target = tmp_path / options.pop("out", "out")
    method, amount = options.pop("method", "l1"), options.pop("amount", 0.5)
    before = files(tmp_path)
    with pytest.raises((ValueError, TypeError, OSError)):
        prunekit.prune_sharded(tmp_path / "ckpt", target, amount, method=method, **options)
    assert files(tmp_path) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


CLI_CASES: list[tuple[str, list[str]]] = [
    ("output is input", ["-o", "{ckpt}", "--amount", "0.5"]),
    ("amount x", ["-o", "{out}", "--amount", "x"]),
    ("amount -1", ["-o", "{out}", "--amount", "-1"]),
    ("seed 2**70", ["-o", "{out}", "--amount", "0.5", "--method", "random",
                    "--seed", str(2**70)]),
    ("method x", ["-o", "{out}", "--amount", "0.5", "--method", "x"]),
    ("no output", ["--amount", "0.5"]),
    ("output inside input", ["-o", "{ckpt}/x", "--amount", "0.5"]),
]  # fmt: skip


@pytest.mark.parametrize(("label", "argv"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_prune_fails_leaving_every_file(
    tmp_path: Path, label: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = write_sharded(tmp_path / "ckpt")
    out = tmp_path / "out"
    prunekit.prune_sharded(ckpt, out, 0.25, method="l1")
    before = files(tmp_path)
    args = ["prune", str(ckpt)] + [a.format(ckpt=ckpt, out=out) for a in argv]
    assert main(args) != 0
    error = capsys.readouterr().err
    assert error.strip() and "Traceback" not in error
    assert files(tmp_path) == before
