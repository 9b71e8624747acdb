"""Hostile calls of structural pruning: prune_channels (budgets, floors, round_to,
compensation), compact, rotate_hidden, channel_groups and save_compacted / load_compacted on
unusual graphs and tiny Hugging Face models. A compacted model computes what the masked one
did (NaN counts as a difference), a budget removes what it reports, and a refusal leaves the
model (weights, hooks, config) as it was."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import prunekit
from hostile.support import refused, unchanged

# --- what every case checks -------------------------------------------------------------------


def gap(expected: Tensor, got: Tensor) -> float:
    """The largest difference of `got` from `expected`, relative to the largest of
    `expected`; a NaN anywhere (or another shape) counts as an infinite difference."""
    if expected.shape != got.shape:
        return math.inf
    diff = (expected.double() - got.double()).abs()
    diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)
    return float(diff.max()) / max(float(expected.double().abs().max()), 1e-30)


def run(model: nn.Module, x: Any) -> Tensor:
    with torch.no_grad():
        out = model(**x) if isinstance(x, dict) else model(x)
    return out.logits if hasattr(out, "logits") else out


def compacts_exactly(model: nn.Module, x: Any, tolerance: float = 1e-5) -> Tensor:
    """Compact the masked `model` and check it computes what it did masked; its output."""
    masked = run(model, x)
    prunekit.compact(model, x, latency_runs=0)
    got = run(model, x)
    assert gap(masked, got) <= tolerance, f"compacted differs from masked by {gap(masked, got)}"
    return got


# --- tensors of the model used outside its layers ---------------------------------------------


class Scaled(nn.Module):
    """A Linear whose output channels meet a buffer of one entry per channel in forward
    (multiplied, or added), then a Linear that reads them."""

    def __init__(self, op: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.op = op
        self.a = nn.Linear(8, 16)
        self.c = nn.Linear(16, 4)
        self.register_buffer("scale", torch.rand(16) + 0.5)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.a(x))
        return self.c(h * self.scale if self.op == "mul" else h + self.scale)


@pytest.mark.parametrize("op", ["mul", "add"])
def test_a_buffer_met_in_forward_goes_with_its_channels(op: str) -> None:
    model, x = Scaled(op).eval(), torch.randn(6, 8)
    prunekit.prune_channels(model, x, 0.5)
    assert model.a.out_features == 16  # masked, not yet removed
    compacts_exactly(model, x)
    assert model.a.out_features == model.c.in_features == 8
    assert tuple(model.scale.shape) == (8,)


def test_a_compacted_buffer_is_saved_and_loaded_at_its_width(tmp_path: Any) -> None:
    model, x = Scaled("add").eval(), torch.randn(6, 8)
    prunekit.prune_channels(model, x, 0.5)
    expected = compacts_exactly(model, x)
    prunekit.save_compacted(model, tmp_path / "saved")
    again = prunekit.load_compacted(Scaled("add").eval(), tmp_path / "saved")
    assert tuple(again.scale.shape) == (8,)
    assert gap(expected, run(again, x)) == 0.0


# --- criteria and compensation on calibration that cannot be measured ------------------------


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)).eval()


X = torch.randn(6, 8, generator=torch.Generator().manual_seed(2))
NOT_FINITE = [("nan", math.nan), ("inf", math.inf), ("huge", 1e30)]


@pytest.mark.parametrize("criterion", ["obs", "activation", "fluctuation", "taylor"])
@pytest.mark.parametrize(("case", "value"), NOT_FINITE, ids=[c[0] for c in NOT_FINITE])
def test_calibration_of_no_finite_statistics_is_named_and_changes_nothing(
    criterion: str, case: str, value: float
) -> None:
    model = mlp()
    calibration = [X, torch.full((4, 8), value)]
    loss = {"loss": lambda out, batch: out.square().mean()} if criterion == "taylor" else {}
    call = lambda: prunekit.prune_channels(  # noqa: E731
        model, X, 0.5, criterion=criterion, calibration=calibration, **loss
    )
    refused(call, ValueError, r"finite", model=model)


# --- tiny Hugging Face models -------------------------------------------------------------------


def llama(**options: Any) -> nn.Module:
    """A tiny LlamaForCausalLM (hidden 32, 4 query heads in 2 key/value groups, MLP 48), its
    norms' weights and biases random (so that folding and slicing them shows)."""
    import transformers

    settings: dict[str, Any] = dict(
        vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**settings, **options}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
    return model.eval()


IDS = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(1))
CALIBRATION = [torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(i))
               for i in range(3)]  # fmt: skip

ON_META: list[tuple[str, Callable[[nn.Module], Any]]] = [
    ("prune_channels", lambda m: prunekit.prune_channels(m, {"input_ids": IDS}, 0.3)),
    ("compact", lambda m: prunekit.compact(m, {"input_ids": IDS}, latency_runs=0)),
    ("rotate_hidden", lambda m: prunekit.rotate_hidden(m, CALIBRATION, 0.25)),
]


@pytest.mark.parametrize(("entry", "call"), ON_META, ids=[c[0] for c in ON_META])
def test_a_model_on_the_meta_device_is_refused_for_that(
    entry: str, call: Callable[[nn.Module], Any]
) -> None:
    model = llama()
    if entry == "compact":
        prunekit.prune_channels(model, {"input_ids": IDS}, 0.3)
    model = model.to("meta")
    refused(lambda: call(model), ValueError, rf"^{entry}: .*meta device", model=model)


# --- options ------------------------------------------------------------------------------------

BAD_EXCLUDE: list[tuple[str, Any, type[BaseException], str]] = [
    ("int", 3, TypeError, r"^prune_channels: invalid exclude=3; expected"),
    ("float", 0.5, TypeError, r"^prune_channels: invalid exclude=0\.5; expected"),
    ("item-int", ["0", 3], TypeError, r"^prune_channels: invalid exclude=\['0', 3\].*expected"),
    ("old-name-int", None, TypeError, r"^prune_channels: invalid ignore=3; expected"),
    ("not-in-model", [nn.Linear(2, 2)], ValueError,
     r"^prune_channels: exclude holds a Linear that is no module of the model; expected"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "exclude", "error", "match"), BAD_EXCLUDE,
                         ids=[c[0] for c in BAD_EXCLUDE])  # fmt: skip
def test_a_bad_exclude_is_named_and_changes_nothing(
    case: str, exclude: Any, error: type[BaseException], match: str
) -> None:
    model = mlp()
    given = {"ignore": 3} if case == "old-name-int" else {"exclude": exclude}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # ignore= is the old name
        refused(lambda: prunekit.prune_channels(model, X, 0.5, **given), error, match,
                model=model)  # fmt: skip


# --- one tensor read by channels and by values of no channel ------------------------------------


class Recurrent(nn.Module):
    """One layer run on the model's input, then again on its own output: its input columns
    read the input's features first (no channel of a layer), then its own channels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.b(x)))))


class SharedWeight(nn.Module):
    """Two layers holding one Parameter: the first reads the model's input with it, the
    second the first's channels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.b.weight = self.a.weight

    def forward(self, x: Tensor) -> Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class SharedNorm(nn.Module):
    """One BatchNorm run on the model's input and on a layer's channels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.n = nn.BatchNorm1d(16)
        self.a, self.c = nn.Linear(16, 16), nn.Linear(16, 4)
        with torch.no_grad():
            self.n.weight.uniform_(0.5, 1.5)
            self.n.bias.normal_()

    def forward(self, x: Tensor) -> Tensor:
        return self.c(torch.relu(self.n(self.a(torch.relu(self.n(x))))))


@pytest.mark.parametrize("make", [Recurrent, SharedWeight, SharedNorm])
def test_a_tensor_that_also_reads_values_of_no_channel_keeps_those_positions(
    make: Callable[[], nn.Module],
) -> None:
    model, x = make().eval(), torch.randn(6, 16)
    dense = run(model, x)
    prunekit.prune_channels(model, x, 0.5)
    assert gap(dense, run(model, x)) == 0.0  # nothing could go: the model's input is read
    compacts_exactly(model, x)
    assert any("no channel" in (g.reason or "") for g in prunekit.channel_groups(make(), x))


# --- torch's own transformer layers -----------------------------------------------------------


class Encoder(nn.Module):
    """torch's TransformerEncoder between two Linears (its eval fast path needs the heads
    to make the attention's width)."""

    def __init__(self, norm_first: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.i, self.o = nn.Linear(8, 16), nn.Linear(16, 4)
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                           norm_first=norm_first)  # fmt: skip
        self.t = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.o(self.t(self.i(x)))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("cut", [{"heads": 0.5}, {"hidden": 0.25}], ids=["heads", "hidden"])
def test_torchs_encoder_layers_compact_with_heads_or_width_cut(
    cut: dict[str, float], norm_first: bool
) -> None:
    model, x = Encoder(norm_first).eval(), torch.randn(2, 5, 8)
    prunekit.prune_channels(model, x, 0.25, **cut)
    got = compacts_exactly(model, x)
    again = torch.randn(3, 7, 8)  # other shapes, the fast path's conditions met
    with torch.no_grad():
        assert bool(model(again).isfinite().all()) and got.shape == (2, 5, 4)


def test_a_compacted_multihead_attention_is_loaded_into_a_fresh_model(tmp_path: Any) -> None:
    model, x = Encoder(False).eval(), torch.randn(2, 5, 8)
    prunekit.prune_channels(model, x, 0.25, heads=0.5)
    expected = compacts_exactly(model, x)
    prunekit.save_compacted(model, tmp_path / "saved")
    again = prunekit.load_compacted(Encoder(False).eval(), tmp_path / "saved")
    assert again.t.layers[0].self_attn.num_heads == 2
    assert gap(expected, run(again, x)) == 0.0


# --- example inputs that trace nothing ----------------------------------------------------------

EMPTY = torch.zeros(0, 8)
ON_EMPTY: list[tuple[str, Callable[[nn.Module], Any]]] = [
    ("channel_groups", lambda m: prunekit.channel_groups(m, EMPTY)),
    ("prune_channels", lambda m: prunekit.prune_channels(m, EMPTY, 0.5)),
    ("compact", lambda m: prunekit.compact(m, (EMPTY,), latency_runs=0)),
    ("compact-dict", lambda m: prunekit.compact(m, {"input": EMPTY}, latency_runs=0)),
]


@pytest.mark.parametrize(("entry", "call"), ON_EMPTY, ids=[f"empty-{c[0]}" for c in ON_EMPTY])
def test_empty_example_inputs_are_refused(entry: str, call: Callable[[nn.Module], Any]) -> None:
    """An empty batch carries no channel: traced, every layer looked unread (the output
    layer's channels prunable) and prune_channels masked the model's outputs."""
    model = mlp()
    if entry.startswith("compact"):
        prunekit.prune_channels(model, X, 0.5)
    owner = entry.split("-")[0]
    refused(lambda: call(model), ValueError, rf"^{owner}: example_inputs .*empty", model=model)


NOT_COMPUTABLE = [("nan-row", math.nan), ("inf-row", math.inf)]


@pytest.mark.parametrize(("case", "value"), NOT_COMPUTABLE, ids=[c[0] for c in NOT_COMPUTABLE])
def test_example_inputs_the_masked_model_computes_nan_on_are_named_for_that(
    case: str, value: float
) -> None:
    """It was 'the compacted model differs from the masked one by nan'."""
    model = mlp()
    prunekit.prune_channels(model, X, 0.5)
    x = torch.cat([X[:3], torch.full((1, 8), value)])
    refused(lambda: prunekit.compact(model, x, latency_runs=0), ValueError,
            r"^compact: the masked model's outputs on example_inputs hold NaN", model=model)  # fmt: skip
