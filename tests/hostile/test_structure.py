"""Hostile calls of structural pruning: prune_channels (budgets, floors, round_to,
compensation), compact, rotate_hidden, channel_groups and save_compacted / load_compacted on
unusual graphs and tiny Hugging Face models. A compacted model computes what the masked one
did (NaN counts as a difference), a budget removes what it reports, and a refusal leaves the
model (weights, hooks, config) as it was."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from torch import Tensor, nn

import prunekit
from hostile.support import refused

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
    found: Tensor = out.logits if hasattr(out, "logits") else out
    return found


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
        h, scale = torch.relu(self.a(x)), cast(Tensor, self.scale)
        out: Tensor = self.c(h * scale if self.op == "mul" else h + scale)
        return out


@pytest.mark.parametrize("op", ["mul", "add"])
def test_a_buffer_met_in_forward_goes_with_its_channels(op: str) -> None:
    model: Any = Scaled(op).eval()
    x = torch.randn(6, 8)
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
    again: Any = prunekit.load_compacted(Scaled("add").eval(), tmp_path / "saved")
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
    loss: dict[str, Any] = (
        {"loss": lambda out, batch: out.square().mean()} if criterion == "taylor" else {}
    )
    call = lambda: prunekit.prune_channels(  # noqa: E731
        model, X, 0.5, criterion=criterion, calibration=calibration, **loss
    )
    if case == "huge" and criterion in ("activation", "fluctuation"):
        # finite inputs whose squares pass float32 are summed in float64: the norms are finite
        call()
        masks = [b for n, b in model.named_buffers() if n.endswith("_mask")]
        assert masks and all(bool(torch.isfinite(p).all()) for p in model.parameters())
        assert sum(int((m == 0).sum()) for m in masks) > 0
        return
    refused(call, ValueError, r"finite", model=model)


# --- tiny Hugging Face models -------------------------------------------------------------------


def llama(**options: Any) -> Any:
    """A tiny LlamaForCausalLM (hidden 32, 4 query heads in 2 key/value groups, MLP 48), its
    norms' weights and biases random (so that folding and slicing them shows)."""
    import transformers

    settings: dict[str, Any] = dict(
        vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model: Any = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**settings, **options}))
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
        out: Tensor = self.c(torch.relu(self.b(torch.relu(self.b(x)))))
        return out


class SharedWeight(nn.Module):
    """Two layers holding one Parameter: the first reads the model's input with it, the
    second the first's channels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.b.weight = self.a.weight

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.c(torch.relu(self.b(torch.relu(self.a(x)))))
        return out


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
        out: Tensor = self.c(torch.relu(self.n(self.a(torch.relu(self.n(x))))))
        return out


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
        out: Tensor = self.o(self.t(self.i(x)))
        return out


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("cut", [{"heads": 0.5}, {"hidden": 0.25}], ids=["heads", "hidden"])
def test_torchs_encoder_layers_compact_with_heads_or_width_cut(
    cut: dict[str, Any], norm_first: bool
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
    again: Any = prunekit.load_compacted(Encoder(False).eval(), tmp_path / "saved")
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
    nan = r"^compact: the masked model's outputs on example_inputs hold NaN"
    refused(lambda: prunekit.compact(model, x, latency_runs=0), ValueError, nan, model=model)


# --- held: compaction of unusual graphs equals the masked model ---------------------------------


class Graph(nn.Module):
    """A model of one forward function over the layers given by name."""

    def __init__(self, forward: Callable[[Any, Tensor], Tensor], **layers: nn.Module) -> None:
        super().__init__()
        self.run = forward
        for name, layer in layers.items():
            self.add_module(name, layer)

    def forward(self, x: Tensor) -> Tensor:
        return self.run(self, x)


def _graphs() -> list[tuple[str, Callable[[], nn.Module], Tensor, dict[str, Any]]]:
    lin, conv = nn.Linear, nn.Conv2d
    vec, img = torch.randn(6, 8), torch.randn(2, 3, 6, 6)
    relu, sig = torch.relu, torch.sigmoid
    return [
        ("module-twice", lambda: Graph(lambda s, x: s.c(relu(s.b(relu(s.b(relu(s.a(x))))))),
                                       a=lin(8, 16), b=lin(16, 16), c=lin(16, 4)), vec, {}),
        ("cat", lambda: Graph(lambda s, x: s.c(torch.cat([relu(s.a(x)), sig(s.b(x))], -1)),
                              a=lin(8, 16), b=lin(8, 12), c=lin(28, 4)), vec, {}),
        ("chunk-gate", lambda: Graph(lambda s, x: s.c(relu(s.a(x).chunk(2, -1)[0])
                                                      * s.a(x).chunk(2, -1)[1]),
                                     a=lin(8, 32), c=lin(16, 4)), vec, {}),
        ("inplace-residual", lambda: Graph(
            lambda s, x: s.c(s.a(x).add_(s.b(relu(s.a(x)))).relu_()),
            a=lin(8, 16), b=lin(16, 16), c=lin(16, 4)), vec, {}),
        ("parameter-in-forward", lambda: Graph(
            lambda s, x: s.c(relu(s.a(x)) * s.g.weight + s.g.weight),
            a=lin(8, 16), g=nn.LayerNorm(16), c=lin(16, 4)), vec, {}),
        ("sigmoid-fold-bias-free", lambda: Graph(lambda s, x: s.c(sig(s.a(x))),
                                                 a=lin(8, 16, bias=False), c=lin(16, 4)), vec, {}),
        ("depthwise-grouped-bn", lambda: Graph(
            lambda s, x: s.p(relu(s.g(relu(s.bn(s.dw(relu(s.a(x)))))))).mean((2, 3)),
            a=conv(3, 8, 1), dw=conv(8, 8, 3, padding=1, groups=8), bn=nn.BatchNorm2d(8),
            g=conv(8, 8, 3, padding=1, groups=2), p=conv(8, 4, 1)), img, {}),
        ("depthwise-multiplier", lambda: Graph(
            lambda s, x: s.c(relu(s.d(relu(s.a(x))))).mean((2, 3)),
            a=conv(3, 8, 1), d=conv(8, 16, 3, padding=1, groups=8), c=conv(16, 4, 1)), img, {}),
        ("groupnorm-flatten", lambda: Graph(
            lambda s, x: s.c(relu(s.n(s.a(x))).flatten(1)),
            a=conv(3, 8, 3, padding=1, bias=False), n=nn.GroupNorm(4, 8), c=lin(8 * 36, 4)),
            img, {}),
        ("squeeze-excite", lambda: Graph(
            lambda s, x: (lambda h: s.h(h * sig(s.e2(relu(s.e1(h.mean((2, 3))))))[:, :, None, None])
                          .mean((2, 3)))(relu(s.a(x))),
            a=conv(3, 8, 3, padding=1), e1=lin(8, 4), e2=lin(4, 8), h=conv(8, 4, 1)), img, {}),
        ("sigmoid-reflect-pad", lambda: Graph(
            lambda s, x: s.c(sig(s.a(x))).mean((2, 3)),
            a=conv(3, 8, 3, padding=1), c=conv(8, 4, 3, padding=1, padding_mode="reflect")),
            img, {}),
        ("prelu-layernorm-hidden", lambda: Graph(lambda s, x: s.c(s.n(s.p(s.a(x)))),
                                                 a=lin(8, 16), p=nn.PReLU(16), n=nn.LayerNorm(16),
                                                 c=lin(16, 4)), vec, {"hidden": 0.5}),
        ("multihead-attention", lambda: Graph(
            lambda s, x: s.o(s.att(s.i(x), s.i(x), s.i(x), need_weights=False)[0]),
            i=lin(8, 16), att=nn.MultiheadAttention(16, 4, batch_first=True), o=lin(16, 4)),
            torch.randn(2, 5, 8), {"heads": 0.5}),
    ]  # fmt: skip


GRAPHS = _graphs()


@pytest.mark.parametrize(("case", "make", "x", "options"), GRAPHS, ids=[g[0] for g in GRAPHS])
def test_an_unusual_graph_compacts_to_what_it_computed_masked(
    case: str, make: Callable[[], nn.Module], x: Tensor, options: dict[str, Any]
) -> None:
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():  # biases and norms that make removed channels carry constants
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                cast(Tensor, m.running_mean).normal_()
                cast(Tensor, m.running_var).uniform_(0.5, 2.0)
    before = sum(p.numel() for p in model.parameters())
    prunekit.prune_channels(model, x, 0.5, **options)
    compacts_exactly(model, x)
    assert sum(p.numel() for p in model.parameters()) < before


# --- held: a budget removes what it reports ---------------------------------------------------


def non_embedding(model: nn.Module) -> int:
    """Parameters counted once, those of nn.Embedding (and a head tied to one) left out."""
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    unique = {id(p): p for p in model.parameters() if id(p) not in embedded}
    return sum(p.numel() for p in unique.values())


BUDGETS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("untied", {}, {}),
    ("tied", {"tie_word_embeddings": True}, {}),
    ("biases", {"attention_bias": True, "mlp_bias": True}, {}),
    ("round-to-8", {}, {"round_to": 8}),
    ("gqa-group", {}, {"gqa": "group"}),
    ("with-hidden", {"tie_word_embeddings": True}, {"kinds": ("channels", "heads", "hidden")}),
    ("floor", {}, {"floor": 0.6, "share": 0.15}),
    ("floor-by-name", {}, {"floor": {"*mlp*": 0.7, "*": 0.2}, "share": 0.2}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "config", "options"), BUDGETS, ids=[b[0] for b in BUDGETS])
def test_a_budget_of_parameters_removes_what_it_reports(
    case: str, config: dict[str, Any], options: dict[str, Any]
) -> None:
    model, inputs = llama(**config), {"input_ids": IDS}
    round_to = options.pop("round_to", None)
    gqa, share = options.pop("gqa", "query"), options.pop("share", 0.3)
    before = non_embedding(model)
    budget = prunekit.Budget(params=share, **options)
    report: Any = prunekit.prune_channels(model, inputs, budget=budget, round_to=round_to, gqa=gqa)
    compacts_exactly(model, inputs)
    removed = before - non_embedding(model)
    assert (report.total, report.removed) == (before, removed)
    assert share <= report.achieved < share + 0.15
    for row in report.rows:
        floor = report.budget.floor_of(row.name)
        assert row.after >= max(1, math.ceil(floor * row.before - 1e-9)), row
        if round_to and row.kind == "channels" and row.after != row.before:
            assert row.after % round_to == 0, row
    widths = [layer.mlp.gate_proj.out_features for layer in model.model.layers]
    assert widths == [r.after for r in report.rows if r.kind == "channels"]


def test_a_budget_of_macs_removes_what_it_reports() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.ReLU(),
                          nn.Conv2d(16, 32, 3, padding=1, groups=4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(32 * 16, 10)).eval()  # fmt: skip
    x = torch.randn(2, 3, 4, 4)
    macs = prunekit.structure.count_macs
    before = macs(model, (x,), {})
    report: Any = prunekit.prune_channels(model, x, budget=prunekit.Budget(macs=0.4))
    compacts_exactly(model, x)
    assert (report.total, report.removed) == (before, before - macs(model, (x,), {}))
    assert report.achieved >= 0.4


# --- held: rotate_hidden ------------------------------------------------------------------------

ROTATED: list[tuple[str, dict[str, Any], torch.dtype, float]] = [
    ("float32", {}, torch.float32, 1e-5),
    ("tied", {"tie_word_embeddings": True}, torch.float32, 1e-5),
    ("biases", {"attention_bias": True, "mlp_bias": True}, torch.float32, 1e-5),
    ("float16", {}, torch.float16, 1e-2),
    ("bfloat16-tied", {"tie_word_embeddings": True}, torch.bfloat16, 5e-2),
]


@pytest.mark.parametrize(("case", "config", "dtype", "tolerance"), ROTATED,
                         ids=[r[0] for r in ROTATED])  # fmt: skip
def test_a_rotation_alone_computes_what_the_model_did(
    case: str, config: dict[str, Any], dtype: torch.dtype, tolerance: float
) -> None:
    model = llama(**config).to(dtype)
    before = run(model, IDS)
    report = prunekit.rotate_hidden(model, CALIBRATION)
    assert (report.width_before, report.width_after) == (32, 32)
    assert report.untied == bool(config.get("tie_word_embeddings"))
    assert gap(before, run(model, IDS)) < tolerance
    assert all(p.dtype == dtype for p in model.parameters())


@pytest.mark.parametrize("config", [{}, {"attention_bias": True, "mlp_bias": True}],
                         ids=["plain", "biases"])  # fmt: skip
def test_a_cut_width_computes_what_the_rotation_did_with_those_directions_zeroed(
    config: dict[str, Any],
) -> None:
    rotated, cut = llama(**config), llama(**config)
    prunekit.rotate_hidden(rotated, CALIBRATION)
    kept = prunekit.rotate_hidden(cut, CALIBRATION, 0.25).width_after
    with torch.no_grad():  # the dropped directions zeroed where they enter the stream
        rotated.model.embed_tokens.weight[:, kept:] = 0
        for layer in rotated.model.layers:
            for writer in (layer.self_attn.o_proj, layer.mlp.down_proj):
                writer.weight[kept:] = 0
                if writer.bias is not None:
                    writer.bias[kept:] = 0
    assert kept == 24 and cut.config.hidden_size == 24
    assert gap(run(rotated, IDS), run(cut, IDS)) < 1e-5


ROTATE_REFUSED: list[tuple[str, Callable[[], list[Any]], str]] = [
    ("second-batch-out-of-vocab", lambda: [CALIBRATION[0], torch.tensor([[1, 2, 300]])],
     r"batch 1"),
    ("float-ids", lambda: [torch.rand(2, 5)], r"batch 0"),
    ("mask-of-other-shape", lambda: [{"input_ids": CALIBRATION[0],
                                      "attention_mask": torch.ones(2, 3)}], r"attention_mask"),
    ("mask-all-zero", lambda: [{"input_ids": CALIBRATION[0],
                                "attention_mask": torch.zeros_like(CALIBRATION[0])}],
     r"no token"),
    ("no-batch", lambda: [], r"calibration"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "calibration", "match"), ROTATE_REFUSED,
                         ids=[f"rotate-{r[0]}" for r in ROTATE_REFUSED])  # fmt: skip
def test_a_rotation_refused_leaves_the_model_and_its_config(
    case: str, calibration: Callable[[], list[Any]], match: str
) -> None:
    model = llama(tie_word_embeddings=True)
    refused(lambda: prunekit.rotate_hidden(model, calibration(), 0.25), ValueError, match,
            model=model)  # fmt: skip


def test_a_rotation_of_a_model_computing_nan_is_refused_and_changes_nothing() -> None:
    model = llama()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = math.nan
    refused(lambda: prunekit.rotate_hidden(model, CALIBRATION, 0.25), ValueError,
            r"^rotate_hidden: .*not all finite", model=model)  # fmt: skip


# --- held: Hugging Face models, compacted, on other inputs and in generate() --------------------


def _tiny(family: str) -> Any:
    import transformers as T

    torch.manual_seed(0)
    if family == "llama-tied":
        return llama(tie_word_embeddings=True)
    model: Any
    if family == "gpt2":
        gpt2 = T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)
        model = T.GPT2LMHeadModel(gpt2)
        return model.eval()
    settings: dict[str, Any] = dict(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    if family == "qwen3-moe":
        moe = T.Qwen3MoeConfig(**settings, num_experts=8, num_experts_per_tok=2,
                               moe_intermediate_size=16, intermediate_size=48)  # fmt: skip
        model = T.Qwen3MoeForCausalLM(moe)
    else:
        model = T.Qwen3ForCausalLM(T.Qwen3Config(**settings, intermediate_size=48))
    return model.eval()


FAMILIES = [
    ("llama-tied", {"heads": 0.5, "hidden": 0.25}),
    ("gpt2", {"heads": 0.5, "hidden": 0.25}),
    ("qwen3", {"heads": 0.5, "hidden": 0.25}),
    ("qwen3-moe", {"experts": 0.5, "heads": 0.5, "hidden": 0.25}),
]


@pytest.mark.parametrize(("family", "options"), FAMILIES, ids=[f[0] for f in FAMILIES])
def test_a_compacted_language_model_computes_what_it_did_masked_on_other_inputs(
    family: str, options: dict[str, Any]
) -> None:
    model = _tiny(family)
    example = {"input_ids": IDS[:1, :6]}  # one short row: other inputs differ in shape
    other = torch.randint(0, 100, (3, 13), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(other)
    mask[0, :5] = 0  # left padding
    prunekit.prune_channels(model, example, 0.3, **options)
    masked = run(model, {"input_ids": other, "attention_mask": mask})
    said = model.generate(other, attention_mask=mask, max_new_tokens=5, do_sample=False)
    prunekit.compact(model, example, latency_runs=0)
    assert gap(masked, run(model, {"input_ids": other, "attention_mask": mask})) < 1e-5
    again = model.generate(other, attention_mask=mask, max_new_tokens=5, do_sample=False)
    assert torch.equal(said, again)


HF_REFUSED: list[tuple[str, Callable[[nn.Module], Any], type[BaseException], str]] = [
    ("bad-criterion", lambda m: prunekit.prune_channels(m, {"input_ids": IDS}, 0.3,
                                                        criterion="nope"),
     ValueError, r"criterion='nope'"),
    ("out-of-vocab-calibration", lambda m: prunekit.prune_channels(
        m, {"input_ids": IDS}, 0.3, heads=0.5, compensate=True,
        calibration=[torch.tensor([[1, 2, 500]])]), ValueError, r"batch 0"),
    ("budget-unreachable", lambda m: prunekit.prune_channels(
        m, {"input_ids": IDS}, budget=prunekit.Budget(params=0.99)), ValueError,
     r"cannot be met"),
    ("experts-below-top-k", lambda m: prunekit.prune_channels(
        m, {"input_ids": IDS}, experts=0.9), ValueError, r"experts"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "call", "error", "match"), HF_REFUSED,
                         ids=[h[0] for h in HF_REFUSED])  # fmt: skip
def test_a_refused_call_on_a_language_model_leaves_it_and_its_config(
    case: str, call: Callable[[nn.Module], Any], error: type[BaseException], match: str
) -> None:
    model = _tiny("qwen3-moe" if case.startswith("experts") else "llama-tied")
    prunekit.prune_channels(model, {"input_ids": IDS}, 0.25, hidden=0.25)  # masks and hooks
    refused(lambda: call(model), error, match, model=model)


def test_compensation_from_one_token_warns_and_stays_finite() -> None:
    model = mlp()
    with pytest.warns(UserWarning, match="1 calibration rows"):
        prunekit.prune_channels(model, X, 0.5, compensate=True, calibration=[torch.randn(1, 8)])
    assert bool(run(model, X).isfinite().all())
    compacts_exactly(model, X)


@pytest.mark.parametrize("eps", [1e-6, 0.05])
def test_a_cut_width_is_loaded_into_a_fresh_model_with_its_norms_epsilon(
    tmp_path: Any, eps: float
) -> None:
    """rotate_hidden scales the norms' epsilon with the width cut (so they normalize as the
    full width did): loaded into a model built from the first config, they kept its own."""
    model = llama(rms_norm_eps=eps)
    prunekit.rotate_hidden(model, CALIBRATION, 0.25)
    expected = run(model, IDS)
    prunekit.save_compacted(model, tmp_path / "saved")
    again: Any = prunekit.load_compacted(llama(rms_norm_eps=eps), tmp_path / "saved")
    assert again.model.norm.variance_epsilon == model.model.norm.variance_epsilon
    assert again.config.rms_norm_eps == model.config.rms_norm_eps
    assert gap(expected, run(again, IDS)) == 0.0


def test_a_cut_of_qwen3_warns_that_from_pretrained_would_not_rebuild_its_head_norms() -> None:
    """Qwen3's query/key norms are built with config.rms_norm_eps too, which the cut scales
    for the stream's norms: from_pretrained would give them the scaled one (outputs off by
    1.6e-5 at eps 0.05), silently."""
    import transformers as T

    torch.manual_seed(0)
    config = T.Qwen3Config(vocab_size=100, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=8, rms_norm_eps=0.05)  # fmt: skip
    model: Any = T.Qwen3ForCausalLM(config)
    with pytest.warns(UserWarning, match=r"rotate_hidden: .*q_norm.*load_compacted"):
        prunekit.rotate_hidden(model.eval(), CALIBRATION, 0.25)
    assert model.model.layers[0].self_attn.q_norm.variance_epsilon == 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prunekit.rotate_hidden(llama(), CALIBRATION, 0.25)  # Llama: no such norm, no warning
