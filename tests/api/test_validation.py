"""Every bad input raises a clear error and leaves the model bit-identical."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunekit as prune
import prunekit.dropin.calls
from helpers.model_state import fingerprint

Case = tuple[nn.Module, Callable[[], Any], type[Exception], list[str]]


class Tied(nn.Module):
    """One Parameter under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(3, 4))
        self.b = self.a


class IntParam(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3, 4, dtype=dtype), requires_grad=False)


def linear(*shape: int, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zero-element init
        return nn.Linear(*(shape or (4, 3)), bias=bias)


def pruned_linear() -> nn.Linear:
    lin = linear()
    prune.l1_unstructured(lin, "weight", 0.25)
    return lin


def twice_pruned_linear() -> nn.Linear:
    lin = pruned_linear()
    prune.random_structured(lin, "weight", 1, dim=0)
    return lin


def with_weights(value: float) -> nn.Linear:
    lin = linear()
    with torch.no_grad():
        lin.weight[1, 2] = value
    return lin


def case(name: str) -> Case:
    lin = linear()
    w = "'weight'"
    if name == "amount bool":
        return lin, lambda: prune.l1_unstructured(lin, "weight", True), TypeError, [w, "True"]
    if name == "amount str":
        return lin, lambda: prune.l1_unstructured(lin, "weight", "0.5"), TypeError, [w, "'0.5'"]
    if name == "amount None":
        return lin, lambda: prune.random_unstructured(lin, "weight", None), TypeError, [w, "None"]
    if name == "amount nan":
        return (
            lin,
            lambda: prune.l1_unstructured(lin, "weight", float("nan")),
            ValueError,
            [w, "nan"],
        )
    if name == "amount inf":
        return (
            lin,
            lambda: prune.l1_unstructured(lin, "weight", float("inf")),
            ValueError,
            [w, "inf"],
        )
    if name == "amount above 1":
        return lin, lambda: prune.l1_unstructured(lin, "weight", 1.5), ValueError, [w, "1.5"]
    if name == "amount negative float":
        return lin, lambda: prune.l1_unstructured(lin, "weight", -0.1), ValueError, [w, "-0.1"]
    if name == "amount negative int":
        return lin, lambda: prune.l1_unstructured(lin, "weight", -1), ValueError, [w, "-1"]
    if name == "count too large":
        return lin, lambda: prune.l1_unstructured(lin, "weight", 13), ValueError, [w, "13", "12"]
    if name == "channel count too large":
        call = lambda: prune.ln_structured(lin, "weight", 4, n=1, dim=0)  # noqa: E731
        return lin, call, ValueError, [w, "4", "3 units"]
    if name == "name missing":
        return (
            lin,
            lambda: prune.l1_unstructured(lin, "wieght", 0.5),
            AttributeError,
            ["'wieght'", "'weight'"],
        )
    if name == "name missing with a pruning suffix":
        # Nothing named 'head' is pruned: torch's AttributeError, not a pruning's.
        return (
            lin,
            lambda: prune.l1_unstructured(lin, "head_orig", 0.5),
            AttributeError,
            ["'head_orig'", "does not exist", "'weight'"],
        )
    if name == "name of a buffer":
        bn = nn.BatchNorm1d(3)
        call = lambda: prune.l1_unstructured(bn, "running_mean", 0.5)  # noqa: E731
        return bn, call, TypeError, ["BatchNorm1d", "'running_mean'", "buffer"]
    if name == "name of an int attribute":
        call = lambda: prune.l1_unstructured(lin, "in_features", 0.5)  # noqa: E731
        return lin, call, TypeError, ["'in_features'", "int"]
    if name == "name of a submodule":
        seq = nn.Sequential(linear())
        return (
            seq,
            lambda: prune.l1_unstructured(seq, "0", 0.5),
            TypeError,
            ["Sequential", "'0'", "Linear"],
        )
    if name == "parameter is None":
        nob = linear(bias=False)
        return nob, lambda: prune.l1_unstructured(nob, "bias", 0.5), TypeError, ["'bias'", "None"]
    if name == "name not a str":
        return lin, lambda: prune.l1_unstructured(lin, 3, 0.5), TypeError, ["3", "str"]  # type: ignore[arg-type]
    if name == "module not a module":
        return (
            lin,
            lambda: prune.l1_unstructured("lin", "weight", 0.5),
            TypeError,
            ["str", w, "nn.Module"],
        )  # type: ignore[type-var]
    if name == "scores shape":
        call = lambda: prune.l1_unstructured(lin, "weight", 0.5, importance_scores=torch.ones(4, 3))  # noqa: E731
        return lin, call, ValueError, [w, "(4, 3)", "(3, 4)"]
    if name == "scores dtype":
        scores = torch.ones(3, 4, dtype=torch.bool)
        call = lambda: prune.l1_unstructured(lin, "weight", 0.5, importance_scores=scores)  # noqa: E731
        return lin, call, TypeError, [w, "torch.bool"]
    if name == "scores device":
        scores = torch.ones(3, 4, device="meta")
        call = lambda: prune.l1_unstructured(lin, "weight", 0.5, importance_scores=scores)  # noqa: E731
        return lin, call, ValueError, [w, "meta", "cpu"]
    if name == "scores nan":
        scores = torch.ones(3, 4)
        scores[2, 1] = float("nan")
        call = lambda: prune.l1_unstructured(lin, "weight", 0.5, importance_scores=scores)  # noqa: E731
        return lin, call, ValueError, [w, "nan", "(2, 1)"]
    if name == "scores not a tensor":
        call = lambda: prune.l1_unstructured(lin, "weight", 0.5, importance_scores=[1.0])  # noqa: E731
        return lin, call, TypeError, [w, "list"]
    if name == "weights nan":
        bad = with_weights(float("nan"))
        return (
            bad,
            lambda: prune.l1_unstructured(bad, "weight", 0.5),
            ValueError,
            [w, "nan", "(1, 2)"],
        )
    if name == "weights inf":
        bad = with_weights(float("inf"))
        return (
            bad,
            lambda: prune.l1_unstructured(bad, "weight", 0.5),
            ValueError,
            [w, "inf", "(1, 2)"],
        )
    if name == "weights nan structured":
        bad = with_weights(float("nan"))
        call = lambda: prune.ln_structured(bad, "weight", 1, n=2, dim=0)  # noqa: E731
        return bad, call, ValueError, [w, "nan"]
    if name == "empty tensor count":
        empty = linear(0, 3)
        return (
            empty,
            lambda: prune.l1_unstructured(empty, "weight", 1),
            ValueError,
            [w, "amount=1", "0 units"],
        )
    if name == "integer parameter":
        m = IntParam(torch.int64)
        return (
            m,
            lambda: prune.l1_unstructured(m, "w", 0.5),
            TypeError,
            ["'w'", "torch.int64", "floating"],
        )
    if name == "bool parameter":
        m = IntParam(torch.bool)
        return (
            m,
            lambda: prune.random_unstructured(m, "w", 0.5),
            TypeError,
            ["'w'", "torch.bool", "floating"],
        )
    if name == "mask shape":
        call = lambda: prune.custom_from_mask(lin, "weight", torch.ones(4, 3))  # noqa: E731
        return lin, call, ValueError, [w, "(4, 3)", "(3, 4)"]
    if name == "mask values":
        mask = torch.ones(3, 4)
        mask[0, 3] = 0.5
        call = lambda: prune.custom_from_mask(lin, "weight", mask)  # noqa: E731
        return lin, call, ValueError, [w, "0.5", "(0, 3)", "0 and 1"]
    if name == "mask not a tensor":
        return lin, lambda: prune.custom_from_mask(lin, "weight", [[1]]), TypeError, [w, "list"]  # type: ignore[arg-type]
    if name == "structured 1-D":
        call = lambda: prune.ln_structured(lin, "bias", 0.5, n=2, dim=0)  # noqa: E731
        return lin, call, ValueError, ["'bias'", "(3,)", "2 or more dims"]
    if name == "dim out of range":
        call = lambda: prune.ln_structured(lin, "weight", 0.5, n=2, dim=2)  # noqa: E731
        return lin, call, IndexError, [w, "dim=2", "[-2, 1]"]
    if name == "dim not an int":
        call = lambda: prune.random_structured(lin, "weight", 0.5, dim=0.0)  # type: ignore[arg-type]  # noqa: E731
        return lin, call, TypeError, [w, "dim=0.0", "int"]
    if name == "norm order negative":
        call = lambda: prune.ln_structured(lin, "weight", 0.5, n=-1, dim=0)  # noqa: E731
        return lin, call, ValueError, [w, "n=-1", "positive"]
    if name == "norm order unknown":
        call = lambda: prune.ln_structured(lin, "weight", 0.5, n="l2", dim=0)  # noqa: E731
        return lin, call, ValueError, [w, "'l2'", "'fro'"]
    if name == "global structured method":
        call = lambda: prune.global_unstructured(  # noqa: E731
            [(lin, "weight")], prune.LnStructured, amount=0.5, n=1, dim=0
        )
        return lin, call, TypeError, ["LnStructured", "'structured'", "'unstructured'"]
    if name == "global method not a class":
        call = lambda: prune.global_unstructured([(lin, "weight")], "l1", amount=0.5)  # type: ignore[arg-type]  # noqa: E731
        return lin, call, TypeError, ["'l1'", "BasePruningMethod"]
    if name == "remove unpruned":
        return lin, lambda: prune.remove(lin, "weight"), ValueError, [w, "not pruned"]
    if name == "tied in one module":
        tied = Tied()
        return (
            tied,
            lambda: prune.l1_unstructured(tied, "a", 0.5),
            ValueError,
            ["'a'", "'b'", "tied"],
        )
    if name == "name taken":
        lin.register_buffer("weight_mask", torch.ones(1))
        return (
            lin,
            lambda: prune.l1_unstructured(lin, "weight", 0.5),
            ValueError,
            [w, "'weight_mask'"],
        )
    if name == "pruned by torch":
        torch_prune.l1_unstructured(lin, "weight", 0.5)
        return (
            lin,
            lambda: prune.l1_unstructured(lin, "weight", 0.5),
            ValueError,
            [w, "torch.nn.utils.prune"],
        )
    raise KeyError(name)


CASES = [
    "amount bool",
    "amount str",
    "amount None",
    "amount nan",
    "amount inf",
    "amount above 1",
    "amount negative float",
    "amount negative int",
    "count too large",
    "channel count too large",
    "name missing",
    "name missing with a pruning suffix",
    "name of a buffer",
    "name of an int attribute",
    "name of a submodule",
    "parameter is None",
    "name not a str",
    "module not a module",
    "scores shape",
    "scores dtype",
    "scores device",
    "scores nan",
    "scores not a tensor",
    "weights nan",
    "weights inf",
    "weights nan structured",
    "empty tensor count",
    "integer parameter",
    "bool parameter",
    "mask shape",
    "mask values",
    "mask not a tensor",
    "structured 1-D",
    "dim out of range",
    "dim not an int",
    "norm order negative",
    "norm order unknown",
    "global structured method",
    "global method not a class",
    "remove unpruned",
    "tied in one module",
    "name taken",
    "pruned by torch",
]


def check_error(
    model: nn.Module, call: Callable[[], Any], kind: type[Exception], words: list[str]
) -> str:
    before = fingerprint(model)
    with pytest.raises(Exception) as info:
        call()
    assert type(info.value) is kind, f"{type(info.value).__name__}: {info.value}"
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert "expected" in message, message
    assert fingerprint(model) == before
    return message


@pytest.mark.parametrize("name", CASES)
def test_bad_input_raises_and_changes_nothing(name: str) -> None:
    model, call, kind, words = case(name)
    message = check_error(model, call, kind, words)
    if isinstance(model, nn.Module) and "global" not in name and "module not" not in name:
        assert type(model).__name__ in message


@pytest.mark.parametrize("name", CASES)
def test_failed_composition_keeps_the_old_pruning(name: str) -> None:
    """The same bad inputs, on a tensor pruned twice already: the container is untouched."""
    if name in ("name taken", "pruned by torch", "remove unpruned", "module not a module"):
        return  # only meaningful on an unpruned tensor
    model, call, kind, _ = case(name)
    if "weight" in model._parameters and isinstance(model, nn.Linear):
        prune.random_unstructured(model, "weight", 0.25)
        prune.random_structured(model, "weight", 0.34, dim=1)
    before = fingerprint(model)
    with pytest.raises(kind):
        call()
    assert fingerprint(model) == before


@pytest.mark.parametrize(
    ("build", "call", "kind"),
    [
        (linear, lambda m, p: p.l1_unstructured(m, "weight", "0.5"), TypeError),
        (linear, lambda m, p: p.l1_unstructured(m, "weight", 1.5), ValueError),
        (linear, lambda m, p: p.l1_unstructured(m, "weight", -1), ValueError),
        (linear, lambda m, p: p.l1_unstructured(m, "weight", 13), ValueError),
        (linear, lambda m, p: p.ln_structured(m, "weight", 0.5, n=2, dim=2), IndexError),
        (linear, lambda m, p: p.remove(m, "weight"), ValueError),
        (linear, lambda m, p: p.ln_structured(m, "bias", 0.5, n=2, dim=0), ValueError),
        (linear, lambda m, p: p.l1_unstructured(m, "wieght", 0.5), AttributeError),
        (
            linear,
            lambda m, p: p.global_unstructured(
                [(m, "weight")], p.LnStructured, amount=1, n=1, dim=0
            ),
            TypeError,
        ),
    ],
)
def test_error_types_match_torch(
    build: Callable[[], nn.Module], call: Callable[[nn.Module, Any], Any], kind: type[Exception]
) -> None:
    with pytest.raises(kind):
        call(build(), torch_prune)
    with pytest.raises(kind):
        call(build(), prune)


def test_composition_failure_keeps_the_hook_torch_drops() -> None:
    """torch installs the new container before computing; a failure loses the old hook."""
    ours, theirs = linear(), linear()
    prune.l1_unstructured(ours, "weight", 0.25)
    torch_prune.l1_unstructured(theirs, "weight", 0.25)
    hook = next(iter(ours._forward_pre_hooks.values()))
    with pytest.raises(IndexError):
        prune.ln_structured(ours, "weight", 0.5, n=2, dim=3)
    assert list(ours._forward_pre_hooks.values()) == [hook]
    assert torch.equal(
        ours(torch.ones(1, 4)),
        nn.functional.linear(torch.ones(1, 4), ours.weight_orig * ours.weight_mask, ours.bias),
    )


def test_install_failure_during_mutation_rolls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even an error raised while the module is being changed leaves it as it was."""
    lin = pruned_linear()
    fresh = linear()
    for model in (fresh, lin):
        before = fingerprint(model)

        def boom(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(type(model), "register_forward_pre_hook", boom)
        monkeypatch.setattr(prune.PruningContainer, "add_pruning_method", boom)
        with pytest.raises(RuntimeError, match="disk on fire"):
            prune.random_unstructured(model, "weight", 0.5)
        monkeypatch.undo()
        assert fingerprint(model) == before


def test_global_checks_every_tensor_before_pruning_any() -> None:
    a, b, c = linear(), linear(), nn.BatchNorm1d(3)
    before = [fingerprint(m) for m in (a, b, c)]
    with pytest.raises(TypeError, match="'running_mean' of BatchNorm1d"):
        prune.global_unstructured(
            [(a, "weight"), (b, "weight"), (c, "running_mean")], prune.L1Unstructured, amount=0.5
        )
    assert [fingerprint(m) for m in (a, b, c)] == before


@pytest.mark.parametrize(
    ("mutate", "kind", "words"),
    [
        (lambda a, b: {"amount": 100}, ValueError, ["amount=100", "21 units"]),
        (
            lambda a, b: {"amount": 0.5, "importance_scores": {(b, "weight"): torch.ones(2)}},
            ValueError,
            ["(2,)"],
        ),
        (
            lambda a, b: {"amount": 0.5, "params": [(a, "weight"), (a, "weight")]},
            ValueError,
            ["listed before"],
        ),
        (lambda a, b: {"amount": 0.5, "tie": True}, ValueError, ["tied"]),
        (lambda a, b: {"amount": 0.5, "nan": True}, ValueError, ["'weight' of Linear", "nan"]),
        (
            lambda a, b: {"amount": 0.5, "params": [(a, "weight"), "b"]},
            TypeError,
            ["'b'", "(module, name)"],
        ),
    ],
)
def test_global_bad_inputs_change_nothing(
    mutate: Callable[[nn.Module, nn.Module], dict[str, Any]],
    kind: type[Exception],
    words: list[str],
) -> None:
    a, b = linear(), linear()
    prune.l1_unstructured(a, "weight", 0.25)  # one pruned, one not
    spec = mutate(a, b)
    if spec.pop("tie", False):
        b.weight = a.weight_orig
    if spec.pop("nan", False):
        with torch.no_grad():
            b.weight[0, 0] = float("nan")
    params = spec.pop("params", [(a, "weight"), (b, "weight")])
    before = [fingerprint(a), fingerprint(b)]
    with pytest.raises(kind) as info:
        prune.global_unstructured(params, prune.L1Unstructured, **spec)
    for word in words:
        assert word in str(info.value)
    assert "expected" in str(info.value)
    assert [fingerprint(a), fingerprint(b)] == before


def test_global_rolls_back_when_a_late_install_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = linear(), linear()
    prune.l1_unstructured(a, "weight", 0.25)
    before = [fingerprint(a), fingerprint(b)]
    real = prunekit.dropin.calls.install
    calls = []

    def flaky(module: nn.Module, name: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(module)
        if len(calls) == 2:
            raise RuntimeError("interrupted")
        return real(module, name, method, *args)

    # global_unstructured installs each tensor's share through base.install().
    monkeypatch.setattr(prunekit.dropin.calls, "install", flaky)
    with pytest.raises(RuntimeError, match="interrupted"):
        prune.global_unstructured([(a, "weight"), (b, "weight")], prune.L1Unstructured, amount=0.5)
    assert [fingerprint(a), fingerprint(b)] == before


def test_empty_tensor_prunes_nothing_like_torch() -> None:
    """Decision: empty tensors are allowed; a fraction prunes 0 entries, a count must be 0."""
    ours, theirs = linear(0, 3), linear(0, 3)
    prune.l1_unstructured(ours, "weight", 0.5)
    torch_prune.l1_unstructured(theirs, "weight", 0.5)
    assert ours.weight_mask.shape == theirs.weight_mask.shape == (3, 0)
    rows, torch_rows = linear(0, 3), linear(0, 3)
    prune.ln_structured(rows, "weight", 1, n=1, dim=0)
    torch_prune.ln_structured(torch_rows, "weight", 1, n=1, dim=0)
    assert torch.equal(rows.weight_mask, torch_rows.weight_mask)
    assert ours(torch.ones(2, 0)).shape == (2, 3)
    prune.remove(ours, "weight")
    assert isinstance(ours.weight, nn.Parameter)


def test_tied_weights_across_modules_prune_through_one_owner_only() -> None:
    """Decision: a Parameter shared by two modules cannot be pruned in one of them silently
    through global_unstructured; pruned through one module, the other keeps the unmasked
    Parameter (as torch does), which is why listing both raises."""
    a, b = linear(), linear()
    b.weight = a.weight
    with pytest.raises(ValueError, match="tied"):
        prune.global_unstructured([(a, "weight"), (b, "weight")], prune.L1Unstructured, amount=2)
    assert a.weight is b.weight


def test_messages_name_the_module_for_dotted_names() -> None:
    mha = nn.MultiheadAttention(4, 2)
    before = fingerprint(mha)
    with pytest.raises(AttributeError, match=r"'out_prj.weight' of MultiheadAttention.*'out_proj'"):
        prune.l1_unstructured(mha, "out_prj.weight", 0.5)
    with pytest.raises(ValueError, match=r"'out_proj.weight' of MultiheadAttention: .*amount=2.5"):
        prune.l1_unstructured(mha, "out_proj.weight", 2.5)
    assert fingerprint(mha) == before
    copy.deepcopy(mha)


class TiedLM(nn.Module):
    """An embedding whose weight the output layer reuses."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_tied_weights_seen_from_a_common_parent_are_refused() -> None:
    model = TiedLM()
    before = fingerprint(model)
    with pytest.raises(ValueError, match=r"'embed.weight' of TiedLM .*'head.weight'.*tied"):
        prune.l1_unstructured(model, "embed.weight", 0.5)
    assert fingerprint(model) == before
    untied = TiedLM()
    untied.head.weight = nn.Parameter(untied.embed.weight.detach().clone())
    prune.l1_unstructured(untied, "embed.weight", 0.5)
    assert prune.is_pruned(untied.embed)
