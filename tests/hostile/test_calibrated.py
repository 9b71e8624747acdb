"""Hostile calibration for the calibrated criteria (prune_model's 'wanda', 'sparsegpt',
'taylor'; per row, N:M) and for compensation (prune_channels(..., compensate=...)): odd
batches give the masks their tokens give, or are refused naming what is wrong with the model
left bit for bit as it was; the mode and the dtype change no mask; compensation keeps the
calibration outputs at least as well as no update, and compaction after it is exact; numbers
of numpy's types are taken as Python's are."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import prunekit
from hostile.support import refused
from prunekit.criteria.sparsegpt import sparsegpt_prune

CALIBRATED = ["wanda", "sparsegpt", "taylor"]


class Block(nn.Module):
    """`up`, a ReLU and a dropout, then `down`, added to the input."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.drop(torch.relu(self.up(x))))


class Net(nn.Module):
    """Two blocks and a head: the calibrated methods go block by block."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(dropout), Block(dropout)])
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def net(dropout: float = 0.0) -> Net:
    torch.manual_seed(0)
    return Net(dropout).eval()


def tokens(*shape: int, seed: int = 1, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


X = tokens(3, 5, 8)


def square(output: torch.Tensor, batch: Any) -> torch.Tensor:
    return output.pow(2).mean()


def pruning(model: nn.Module, method: str, calibration: list[Any], **options: Any) -> Any:
    """``prune_model`` of half of `model` by `method` on `calibration` (Taylor's loss: the
    mean square of the output)."""
    if method == "taylor":
        options.setdefault("loss", square)
    return prunekit.prune_model(model, 0.5, method=method, calibration=calibration, **options)


def masks(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b for n, b in model.named_buffers() if n.endswith("_mask")}


# --- odd batches -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", CALIBRATED)
@pytest.mark.parametrize(
    ("case", "calibration", "match"),
    [
        ("no-batch", [], r"calibration holds no batch"),
        ("no-row", [torch.zeros(0, 5, 8)], r"no row to calibrate on"),
        ("no-token", [torch.zeros(2, 0, 8)], r"no row to calibrate on"),
        ("every-batch-empty", [torch.zeros(0, 5, 8), torch.zeros(3, 0, 8)], r"2 calibration"),
    ],
    ids=["no-batch", "no-row", "no-token", "every-batch-empty"],
)
def test_calibration_without_a_token_is_refused(
    method: str, case: str, calibration: list[Any], match: str
) -> None:
    model = net()
    refused(lambda: pruning(model, method, calibration), ValueError, match, model=model)


@pytest.mark.parametrize("pattern", ["unstructured", "row"])
def test_wanda_of_batches_of_any_length_is_wanda_of_their_tokens(pattern: str) -> None:
    """Batches of one token, of differing lengths and scales count each token once: the
    masks are Wanda's (|W| x the L2 norm of each input feature over all the tokens)."""
    batches = [tokens(1, 1, 8, seed=2), tokens(2, 7, 8, seed=3, scale=30.0), tokens(9, 8, seed=4)]
    model = nn.Sequential(nn.Linear(8, 6))
    weight = model[0].weight.detach().clone()
    prunekit.prune_model(model, 0.5, method="wanda", pattern=pattern, calibration=batches)
    rows = torch.cat([b.reshape(-1, 8) for b in batches]).double()
    scores = weight.double().abs() * rows.norm(dim=0)
    expected = torch.ones_like(scores)
    if pattern == "row":
        expected.scatter_(1, scores.argsort(dim=1)[:, :4], 0.0)
    else:
        expected.view(-1)[scores.flatten().argsort()[: scores.numel() // 2]] = 0.0
    torch.testing.assert_close(model[0].weight_mask, expected.float(), rtol=0, atol=0)


def test_sparsegpt_of_batches_of_any_length_is_sparsegpt_of_their_tokens() -> None:
    """SparseGPT's Hessian is the mean of x x^T over every token, whatever batch holds it:
    the masks and updates are ``sparsegpt_prune``'s on that Hessian."""
    batches = [tokens(1, 1, 8, seed=2), tokens(2, 7, 8, seed=3, scale=3.0), tokens(9, 8, seed=4)]
    model = nn.Sequential(nn.Linear(8, 6))
    weight = model[0].weight.detach().clone()
    prunekit.prune_model(model, 0.5, method="sparsegpt", calibration=batches)
    rows = torch.cat([b.reshape(-1, 8) for b in batches]).double()
    hessian = (rows.T @ rows / rows.shape[0]).float()
    keep, updated = sparsegpt_prune(weight, hessian, 0.5, prunekit.Unstructured())
    assert torch.equal(model[0].weight_mask.bool(), keep)
    torch.testing.assert_close(model[0].weight, updated, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "amount", [0.5, 3, np.float32(0.5), np.int64(3)], ids=["float", "int", "np-float32", "np-int64"]
)
def test_sparsegpt_prune_alone_takes_the_amount_prune_model_takes(amount: Any) -> None:
    """The guide's "the math alone": ``sparsegpt_prune(weight, hessian, amount, pattern)``
    takes a fraction or a count as ``prune_model`` does (it raised AttributeError: 'float'
    object has no attribute 'owner'), and refuses a bad one by name."""
    weight = tokens(4, 8, seed=5)
    rows = tokens(32, 8, seed=6)
    keep, updated = sparsegpt_prune(weight, rows.T @ rows / 32, amount, prunekit.Unstructured())
    pruned = 16 if float(amount) == 0.5 else 3
    assert int((~keep).sum()) == pruned and int((updated[~keep] != 0).sum()) == 0
    for bad, error in [(1.5, ValueError), (-1, ValueError), (True, TypeError), ("0.5", TypeError)]:
        with pytest.raises(error, match=rf"sparsegpt_prune: invalid amount={bad!r}"):
            sparsegpt_prune(weight, rows.T @ rows / 32, bad, prunekit.Unstructured())


# --- values that cannot be ranked -------------------------------------------------------------


def _poisoned(value: float, where: str, earlier: bool) -> tuple[nn.Module, list[Any]]:
    """The model and batches, `value` in the second batch or in an entry of `layers.1.up`
    still unpruned; with `earlier`, every block already holds the masks of an l1 pruning."""
    model, batch = net(), X.clone()
    if earlier:
        prunekit.prune_model(model, 0.25, method="l1", include=["layers.*"])
    if where == "input":
        batch[1, 2, 3] = value
    else:
        up = model.layers[1].up
        weight = up.weight_orig if earlier else up.weight
        row, column = (up.weight_mask == 1).nonzero()[0].tolist() if earlier else (2, 3)
        with torch.no_grad():
            weight[row, column] = value
    return model, [tokens(2, 4, 8, seed=9), batch]


@pytest.mark.parametrize("keep_masks", [True, False], ids=["masks", "permanent"])
@pytest.mark.parametrize("method", CALIBRATED)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=str)
@pytest.mark.parametrize("where", ["input", "weight"])
@pytest.mark.parametrize("earlier", [False, True], ids=["dense", "masked-before"])
def test_a_value_that_cannot_be_ranked_is_refused_naming_a_layer(
    method: str, value: float, where: str, earlier: bool, keep_masks: bool
) -> None:
    """NaN or infinity in a batch or a weight: refused naming a layer whose scores it reaches
    (a weight's own layer, or one before it whose Taylor gradient it spoils), masks,
    parametrizations and weights as they were. On a model pruned before, Taylor's refusal
    was a shape error ("saliency of shape (16, 8); expected the tensor's shape (96,)"): the
    entries still unpruned gathered flat, as for a method without a choice of its own."""
    model, calibration = _poisoned(value, where, earlier)
    before = set(masks(model))
    layer = r"layers\.0\.up" if where == "input" else r"layers\.[01]\.up"
    if where == "weight" and method != "taylor":
        layer = r"layers\.1\.up"
    refused(lambda: pruning(model, method, calibration, keep_masks=keep_masks), ValueError,
            rf"'{layer}\.weight'.*(cannot be ranked|not finite|overflow|NaN|inf)",
            model=model)  # fmt: skip
    assert set(masks(model)) == before


@pytest.mark.parametrize("criterion", ["taylor", "wanda"])
def test_scores_of_a_tensor_pruned_before_that_cannot_be_ranked_are_named(criterion: str) -> None:
    """The drop-in under it: ``Pruning.apply`` with Taylor's saliency (or Wanda's norms)
    holding NaN, on a tensor pruned before, is refused naming the score and where it is in
    the tensor (it gathered the unpruned entries flat and raised a shape error, or ranked
    Wanda's norms against them)."""
    layer = nn.Linear(8, 4)
    prunekit.l1_unstructured(layer, "weight", 0.25)
    row, column = (layer.weight_mask == 1).nonzero()[-1].tolist()
    if criterion == "taylor":
        saliency = tokens(4, 8, seed=3).abs()
        saliency[row, column] = math.nan
        ranks: prunekit.Criterion = prunekit.Taylor(saliency)
        where = rf"\({row}, {column}\)"
    else:
        norms = torch.ones(8)
        norms[column] = math.nan
        ranks, where = prunekit.Wanda(norms), r"\(\d, \d\)"
    refused(lambda: prunekit.Pruning.apply(layer, "weight", 0.5, criterion=ranks),
            ValueError, rf"cannot be ranked, e\.g\. nan at index {where}", model=layer)  # fmt: skip


def test_taylor_scores_nan_only_where_pruned_before_rank_the_entries_left() -> None:
    """NaN in Taylor's saliency only at entries pruned before is no error (they do not
    compete, as for importance_scores): the entries left rank by it. It was a shape error."""
    layer = nn.Linear(8, 4)
    prunekit.l1_unstructured(layer, "weight", 0.25)
    before = layer.weight_mask.clone()
    saliency = tokens(4, 8, seed=3)
    saliency[before == 0] = math.nan
    prunekit.Pruning.apply(layer, "weight", 0.5, criterion=prunekit.Taylor(saliency))
    competing = saliency.abs().masked_fill(before == 0, math.inf).flatten()
    expected = before.clone().flatten()
    expected[competing.argsort()[:12]] = 0.0
    assert torch.equal(layer.weight_mask.flatten(), expected)


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_inputs_whose_squares_overflow_float32_rank_or_are_refused_never_nan(method: str) -> None:
    """Inputs of 1e25 (squares beyond float32): Wanda ranks them (its norms are float64);
    SparseGPT, whose Hessian is float32, refuses naming the layer. Never a NaN weight."""
    model = net()
    calibration = [tokens(3, 5, 8, scale=1e25)]
    if method == "sparsegpt":
        refused(lambda: pruning(model, method, calibration), ValueError,
                r"'layers\.0\.up\.weight'.*overflow", model=model)  # fmt: skip
        return
    pruning(model, method, calibration)
    assert all(torch.isfinite(t).all() for t in model.state_dict().values())


# --- the mode and the dtype -------------------------------------------------------------------


@pytest.mark.parametrize("method", CALIBRATED)
def test_a_model_in_train_mode_prunes_as_in_eval_mode_and_stays_in_train_mode(
    method: str,
) -> None:
    """Dropout in train mode would make the statistics random: calibration runs in eval mode,
    so the masks (and SparseGPT's updates) are eval mode's, twice over, and every module's
    mode is given back."""
    found = []
    for train in (True, True, False):
        model = net(dropout=0.5).train(train)
        pruning(model, method, [X, tokens(2, 3, 8, seed=7)])
        assert [m.training for m in model.modules()] == [train] * len(list(model.modules()))
        found.append(model.state_dict())
    for state in found[1:]:
        assert state.keys() == found[0].keys()
        for name, tensor in state.items():
            assert torch.equal(tensor, found[0][name]), name


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_a_half_model_gets_the_masks_of_its_float32_self(method: str, dtype: torch.dtype) -> None:
    """A float16 or bfloat16 model calibrates in float32 or better: its masks are those of
    the same model in float32 (its weights rounded alike), its weights finite. (Not Taylor:
    its gradients are the model's own backward, in the model's dtype.)"""
    half = net().to(dtype)
    single = copy.deepcopy(half).float()
    pruning(half, method, [X.to(dtype)])
    pruning(single, method, [X.to(dtype).float()])
    assert all(torch.isfinite(t).all() for t in half.state_dict().values())
    assert half.layers[0].up.weight.dtype == dtype
    for name, mask in masks(single).items():
        assert torch.equal(masks(half)[name].float(), mask.float()), name


# --- shared modules and weights ---------------------------------------------------------------


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.head = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.a(torch.relu(self.a(x))))


class Idle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.idle, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.a(x))


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(torch.relu(self.a(x))))


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize("sequential", [False, True, "layers"])
def test_a_layer_called_twice_or_never_is_refused_by_name(method: str, sequential: Any) -> None:
    torch.manual_seed(0)
    twice, idle = Twice(), Idle()
    refused(lambda: pruning(twice, method, [X], sequential=sequential), ValueError,
            r"module 'a' \(Linear\) was called more than once", model=twice)  # fmt: skip
    refused(lambda: pruning(idle, method, [X], sequential=sequential), ValueError,
            r"'idle\.weight'.* never ran on the calibration data", model=idle)  # fmt: skip


def test_taylor_refuses_a_layer_that_never_ran_by_name() -> None:
    torch.manual_seed(0)
    idle = Idle()
    refused(lambda: pruning(idle, "taylor", [X]), ValueError,
            r"'idle\.weight'.*got no gradient", model=idle)  # fmt: skip


@pytest.mark.parametrize("method", ["wanda", "taylor"])
def test_a_tied_weight_is_masked_alike_under_both_names(method: str) -> None:
    torch.manual_seed(0)
    model = Tied()
    pruning(model, method, [X])
    assert torch.equal(model.a.weight_mask, model.b.weight_mask)
    assert float(model.a.weight_mask.mean()) == 0.5
    assert torch.equal(model.a.weight, model.b.weight)


def test_sparsegpt_refuses_a_weight_tied_across_two_layers() -> None:
    """SparseGPT updates the weights it keeps toward one layer's output on that layer's
    inputs; a weight tied to a second layer, which reads other inputs, had the first
    layer's update: on a pair 16 wide, the second layer's error on the very calibration data
    came out 0.184 against 0.115 for the same masks without an update. Refused, naming both
    names and what to do instead."""
    torch.manual_seed(0)
    model = Tied()
    refused(lambda: pruning(model, "sparsegpt", [X]), ValueError,
            r"method='sparsegpt'.*'a\.weight', 'b\.weight' are one Parameter.*"
            r"exclude=\['a\.weight', 'b\.weight'\].*method='wanda'", model=model)  # fmt: skip
    pruning(model, "sparsegpt", [X], exclude=["a.weight", "b.weight"])
    assert set(masks(model)) == {"head.weight_mask"}


# --- compensation -----------------------------------------------------------------------------


def mlp(bias: bool = True, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32, bias=bias), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 8, bias=bias)
    ).eval()


CALIBRATION = [tokens(16, 8, seed=s) for s in range(10, 14)]


def relative_error(model: nn.Module, dense: nn.Module) -> float:
    rows = torch.cat(CALIBRATION)
    with torch.no_grad():
        reference = dense(rows)
        return float((model(rows) - reference).pow(2).sum() / reference.pow(2).sum())


COMPENSATIONS: list[tuple[Any, dict[str, Any]]] = [
    (True, {}), (True, {"damping": 1e-6}), (True, {"damping": 100.0}),
    (True, {"damping": "auto"}), (True, {"token_weights": "equal"}), ("reference", {}),
]  # fmt: skip


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("criterion", ["l2", "activation"])
@pytest.mark.parametrize(("compensate", "options"), COMPENSATIONS, ids=str)
def test_compensation_is_no_worse_than_none_and_compacts_exactly(
    bias: bool, criterion: str, compensate: Any, options: dict[str, Any]
) -> None:
    """On the calibration batches themselves, the compensated model is at least as close to
    the dense one as the same masks without an update; compacting it changes no output
    (NaN would count as a difference)."""
    scoring = {"calibration": CALIBRATION} if criterion == "activation" else {}
    plain = mlp(bias)
    prunekit.prune_channels(plain, CALIBRATION[0][:2], 0.5, criterion=criterion, **scoring)
    model = mlp(bias)
    prunekit.prune_channels(model, CALIBRATION[0][:2], 0.5, criterion=criterion,
                            compensate=compensate, calibration=CALIBRATION, **options)  # fmt: skip
    assert torch.equal(model[0].weight_mask, plain[0].weight_mask)
    assert relative_error(model, mlp(bias)) <= relative_error(plain, mlp(bias)) + 1e-9
    compacted = copy.deepcopy(model)
    prunekit.compact(compacted, CALIBRATION[0][:2], latency_runs=0)
    assert compacted[3].in_features == 16
    with torch.no_grad():
        for batch in CALIBRATION:
            torch.testing.assert_close(compacted(batch), model(batch), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compensate", [True, "reference"], ids=str)
@pytest.mark.parametrize("value", [math.nan, math.inf], ids=str)
def test_compensation_on_batches_that_are_not_finite_is_refused_naming_the_layer(
    compensate: Any, value: float
) -> None:
    model = mlp()
    calibration = [batch.clone() for batch in CALIBRATION]
    calibration[2][3, 1] = value
    refused(lambda: prunekit.prune_channels(model, CALIBRATION[0][:2], 0.5,
                                            compensate=compensate, calibration=calibration),
            ValueError, r"input of 3 .*not finite", model=model)  # fmt: skip


class TiedDown(nn.Module):
    """Two MLPs whose down projections are one Parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 32), nn.Linear(32, 8)
        self.up2, self.down2 = nn.Linear(8, 32), nn.Linear(32, 8)
        self.down2.weight = self.down.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down2(torch.relu(self.up2(self.down(torch.relu(self.up(x))))))


@pytest.mark.parametrize("compensate", [True, "reference"], ids=str)
def test_compensation_of_a_weight_tied_to_another_layer_is_refused(compensate: Any) -> None:
    """Updating `down` in place moved `down2` (the same Parameter) unchecked: the model's
    error on the calibration batches came out 0.210 (True) and 0.438 ('reference') against
    0.190 for the same masks without compensation. Refused, naming both."""
    torch.manual_seed(0)
    model = TiedDown().eval()
    refused(lambda: prunekit.prune_channels(model, CALIBRATION[0][:2], 0.5,
                                            compensate=compensate, calibration=CALIBRATION),
            ValueError, rf"compensate={compensate!r} would update 'down\.weight' in place, "
            r"but 'down\.weight', 'down2\.weight' are one Parameter", model=model)  # fmt: skip
    prunekit.prune_channels(model, CALIBRATION[0][:2], 0.5)  # without compensation: taken


class Branch(nn.Module):
    """`up`, then `down` for a batch of several rows, `other` for a batch of one."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.other = nn.Linear(8, 32), nn.Linear(32, 8), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.up(x))
        return self.down(hidden) if x.shape[0] > 1 else self.other(hidden)


@pytest.mark.parametrize("compensate", [True, "reference"], ids=str)
def test_a_reader_the_calibration_never_runs_is_named_not_left_silently(compensate: Any) -> None:
    """The example inputs (one row) run `other`, which reads the units removed; the
    calibration batches (16 rows) never do: no update can be fitted for it, and it was left
    as it was without a word. Now a warning names it."""
    torch.manual_seed(0)
    model = Branch().eval()
    other = model.other.weight.detach().clone()
    with pytest.warns(
        UserWarning,
        match=rf"compensate={compensate!r} left 'other' as it was: "
        r"it reads removed units .* never ran on the first calibration batch",
    ):
        prunekit.prune_channels(model, CALIBRATION[0][:1], 0.5, compensate=compensate,
                                calibration=CALIBRATION)  # fmt: skip
    assert torch.equal(model.other.weight_orig, other)
    assert float(model.up.weight_mask.mean()) == 0.5


@pytest.mark.parametrize("compensate", [True, "reference"], ids=str)
def test_compensation_in_train_mode_is_eval_modes(compensate: Any) -> None:
    found = []
    for train in (True, False):
        model = mlp(dropout=0.5).train(train)
        prunekit.prune_channels(model, CALIBRATION[0][:2], 0.5, compensate=compensate,
                                calibration=CALIBRATION)  # fmt: skip
        assert all(m.training == train for m in model.modules())
        found.append(model.state_dict())
    for name, tensor in found[0].items():
        assert torch.equal(tensor, found[1][name]), name


# --- numbers of numpy's types ----------------------------------------------------------------

NUMPY: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("amount-float32", {"amount": np.float32(0.5)}, {"amount": 0.5}),
    ("heads-float32", {"amount": 0.25, "heads": np.float32(0.5)}, {"amount": 0.25, "heads": 0.5}),
    ("round_to-int64", {"amount": 0.5, "round_to": np.int64(4)}, {"amount": 0.5, "round_to": 4}),
    ("damping-float32", {"amount": 0.5, "compensate": True, "damping": np.float32(0.25)},
     {"amount": 0.5, "compensate": True, "damping": 0.25}),
]  # fmt: skip


@pytest.mark.filterwarnings("ignore:.*fewer rows than features:UserWarning")
@pytest.mark.parametrize(("case", "given", "plain"), NUMPY, ids=[c[0] for c in NUMPY])
def test_prune_channels_takes_numpy_numbers_as_pythons(
    case: str, given: dict[str, Any], plain: dict[str, Any]
) -> None:
    """``np.float64(0.5)`` was taken and ``np.float32(0.5)`` refused as 'expected a float';
    numpy integers as round_to, numpy floats as damping were refused too."""
    from helpers import tiny_llm

    ids = {"input_ids": torch.randint(0, 300, (2, 8), generator=torch.Generator().manual_seed(0))}
    calibration = {"calibration": [ids]} if "compensate" in given else {}
    results = []
    for options in (given, plain):
        model = tiny_llm.llama(layers=1)
        prunekit.prune_channels(model, ids, **options, **calibration)
        results.append(model.state_dict())
    assert results[0].keys() == results[1].keys()
    for name, tensor in results[0].items():
        assert torch.equal(tensor, results[1][name]), name


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"amount": np.float32(1.5)}, r"invalid amount=np\.float32\(1\.5\)"),
        ({"amount": np.int64(0)}, r"invalid amount=np\.int64\(0\)"),
        ({"amount": 0.5, "round_to": np.int64(0)}, r"invalid round_to=np\.int64\(0\)"),
        ({"amount": 0.5, "round_to": np.float64(4.0)}, r"invalid round_to=np\.float64\(4\.0\)"),
        ({"amount": 0.5, "heads": np.bool_(True)}, r"invalid heads=np\.True_"),
    ],
    ids=["amount-out-of-range", "amount-an-int", "round_to-zero", "round_to-float", "heads-bool"],
)
def test_numpy_numbers_out_of_range_are_still_refused(options: dict[str, Any], match: str) -> None:
    model = mlp()
    refused(lambda: prunekit.prune_channels(model, CALIBRATION[0][:2], **options), ValueError,
            match, model=model)  # fmt: skip
