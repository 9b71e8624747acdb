"""Differential: tracing with the costly ops skipped (fake values) gives the very groups of a
trace computing every op, and an op that could read fake values makes it trace again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import prunekit
from prunekit.structure.graph.grouping import build_groups
from prunekit.structure.graph.groups import ChannelGroup
from prunekit.structure.graph.tables import HANDLERS
from prunekit.structure.trace import skim
from prunekit.structure.trace import tracer as tracer_module
from prunekit.structure.trace.tracer import ModuleHandler, Tracer, run_traced


def _form(groups: list[ChannelGroup]) -> list[tuple[Any, ...]]:
    return [
        (g.kind, g.size, g.reason, g.blocks, g.outputs,
         [(s.module_name, s.name, s.dim, s.role, s.indices, s.channels, s.op) for s in g.slices])
        for g in groups
    ]  # fmt: skip


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[skim.Fakes]]:
    """The `Fakes` of every skimmed trace run, in order (every costly op skipped, however
    small)."""
    made: list[skim.Fakes] = []

    class Kept(skim.Fakes):
        def __init__(self) -> None:
            super().__init__(least=0)
            made.append(self)

    monkeypatch.setattr(tracer_module, "Fakes", Kept)
    yield made


def _both(model: nn.Module, x: Tensor) -> tuple[list[Any], list[Any]]:
    """The groups traced skimming, and computing every op."""
    skimmed, _ = run_traced(model, (x,), {}, HANDLERS)
    full, _ = run_traced(model, (x,), {}, HANDLERS, skim=False)
    return _form(build_groups(skimmed)), _form(build_groups(full))


class _Mixed(nn.Module):
    """Convolutions (a depthwise one), attention (MHA and a hand-made one), a batched matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding="same", groups=16)
        self.norm = nn.BatchNorm2d(16)
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.qkv = nn.Linear(16, 48)
        self.mix = nn.Parameter(torch.randn(16, 16))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.norm(self.dw(self.stem(x))))
        tokens = h.flatten(2).transpose(1, 2)
        tokens = tokens + self.attn(tokens, tokens, tokens, need_weights=False)[0]
        q, k, v = self.qkv(tokens).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (4, 4)).transpose(1, 2) for t in (q, k, v))
        tokens = tokens + F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        tokens = tokens + torch.bmm(tokens, self.mix.expand(len(x), -1, -1))
        return self.fc(tokens.mean(1))


def test_a_skimmed_trace_gives_the_groups_of_a_full_one(runs: list[skim.Fakes]) -> None:
    torch.manual_seed(0)
    skimmed, full = _both(_Mixed().eval(), torch.randn(2, 3, 16, 16))
    assert runs[0].skipped == 7 and not runs[0].stopped  # every costly op skipped
    assert skimmed == full


def test_under_autocast_every_op_is_computed(runs: list[skim.Fakes]) -> None:
    with torch.autocast("cpu"):  # the ops' dtypes are not their inputs'
        run_traced(_Mixed().eval(), (torch.randn(2, 3, 16, 16),), {}, HANDLERS)
    assert not runs


class _Excited(nn.Module):
    """A squeeze-and-excitation gate broadcast with ``expand_as`` (the shape of fake values)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.gate = nn.Conv2d(3, 8, 3), nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv(x)
        scale = torch.sigmoid(self.gate(h.mean((2, 3))))[:, :, None, None]
        return h * scale.expand_as(h) + scale.view_as(h.mean((2, 3), keepdim=True))


def test_the_shape_of_fake_values_is_read_without_tracing_again(
    runs: list[skim.Fakes],
) -> None:
    torch.manual_seed(0)
    skimmed, full = _both(_Excited().eval(), torch.randn(1, 3, 8, 8))
    assert skimmed == full
    assert not runs[0].stopped


class _Branches(nn.Module):
    """Python control flow on the activations' values: the branch taken decides the groups."""

    def __init__(self, read: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        self.read = read
        self.conv = nn.Conv2d(3, 4, 1)
        self.wide, self.narrow = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv(x)
        if self.read(h):  # on real values: True; on fake zeros: False
            return self.wide(h)
        return self.narrow(h) + h


@pytest.mark.parametrize(
    "read",
    [lambda h: bool(h.abs().sum() > 0), lambda h: h.abs().sum().item() > 0,
     lambda h: h.abs().sum().tolist() > 0,
     lambda h: bool(torch.zeros_like(h).add(1).sum() > 0)  # real values made from fake
     and bool(torch.full_like(h, h.abs().mean()).sum() > 0)],  # a fake fill value
)  # fmt: skip
def test_a_value_read_in_python_traces_again(
    runs: list[skim.Fakes], read: Callable[[Tensor], Tensor]
) -> None:
    torch.manual_seed(0)
    skimmed, full = _both(_Branches(read).eval(), torch.randn(1, 3, 5, 5))
    assert skimmed == full  # the groups of values computed
    assert runs[0].stopped


class _Caught(_Branches):
    """The model catches what the read raised, and takes the other branch."""

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv(x)
        try:
            wide = bool(h.abs().sum() > 0)
        except Exception:
            wide = False
        return self.wide(h) if wide else self.narrow(h) + h


def test_a_value_read_the_model_catches_traces_again(runs: list[skim.Fakes]) -> None:
    torch.manual_seed(0)
    skimmed, full = _both(_Caught(bool).eval(), torch.randn(1, 3, 5, 5))
    assert skimmed == full  # the groups of values computed
    assert runs[0].stopped


class _Indexed(nn.Module):
    """Indices computed from the activations by ops that read no value, then used to pick
    channels: a move replays its index tensors, so those must be real."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.head = nn.Conv2d(4, 4, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv(x)
        picks = h[0, :, 0, 0].abs().mul(3).clamp(0, 3).to(torch.long)
        return self.head(torch.index_select(h, 1, picks))


def test_indices_of_fake_values_trace_again(runs: list[skim.Fakes]) -> None:
    torch.manual_seed(0)
    model = _Indexed().eval()
    model.conv.bias.data = torch.tensor([3.0, -1.0, 2.0, 0.5])
    skimmed, full = _both(model, torch.randn(1, 3, 5, 5) * 0.01)
    assert skimmed == full  # the groups of values computed
    assert runs[0].stopped


class _Stored(nn.Module):
    """Fake values written into a real tensor, then read through a view made before."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.wide, self.narrow = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)
        self.store = torch.zeros(4)
        self.seen = self.store[:]

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv(x)
        self.store.zero_().add_(h.abs().mean((0, 2, 3)))  # add_: an op of no values read
        if bool(self.seen.sum() > 0):
            return self.wide(h)
        return self.narrow(h) + h


def test_fake_values_written_into_a_real_tensor_trace_again(runs: list[skim.Fakes]) -> None:
    torch.manual_seed(0)
    skimmed, full = _both(_Stored().eval(), torch.randn(1, 3, 5, 5))
    assert skimmed == full  # the groups of values computed
    assert runs[0].stopped


class _Gate(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(x)


class _Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.gate, self.head = nn.Conv2d(3, 4, 1), _Gate(), nn.Conv2d(4, 4, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.gate(self.conv(x)))


def _reading_module(tr: Tracer, module: nn.Module, args: tuple[Any, ...],
                    kwargs: dict[str, Any], out: Any) -> None:  # fmt: skip
    """Blocks the channels when the input's values are all zero (only fake ones are)."""
    if not bool(args[0].abs().sum() > 0):
        tr.block(tr.label(args[0]), "zero")
    tr.set(out, tr.label(args[0]))


def test_a_module_handler_that_reads_values_gets_real_ones(runs: list[skim.Fakes]) -> None:
    torch.manual_seed(0)
    entry = ModuleHandler("reads", lambda m: isinstance(m, _Gate), _reading_module)
    HANDLERS.modules.insert(0, entry)
    try:
        skimmed, full = _both(_Gated().eval(), torch.randn(1, 3, 5, 5))
    finally:
        HANDLERS.modules.remove(entry)
    assert skimmed == full  # the groups of values computed
    assert runs[0].stopped


def test_a_users_op_handler_gets_real_values(runs: list[skim.Fakes]) -> None:
    def reads(tr: Tracer, call: Any) -> None:
        x = call.args[0]
        if not bool(x.abs().sum() > 0):
            tr.block(tr.label(x), "zero")
        tr.set(call.out, tr.label(x))

    torch.manual_seed(0)
    with prunekit.register_op_handler("relu", reads, replace=True):
        skimmed, full = _both(_Gated().eval(), torch.randn(1, 3, 5, 5))
    assert skimmed == full  # the groups of values computed
    assert runs[0].stopped


def _conv_case(spatial: int, **options: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    conv = getattr(F, f"conv{spatial}d")
    x = torch.randn(2, 4, *(9,) * spatial)
    return conv, (x, torch.randn(6, 4 // options.get("groups", 1), *(3,) * spatial)), options


_q = torch.randn(2, 3, 7, 8)
_CASES = [
    (F.linear, (torch.randn(5, 40), torch.randn(60, 40), torch.randn(60)), {}),
    (F.linear, (torch.randn(2, 5, 40).transpose(0, 1), torch.randn(60, 40)), {}),
    (F.linear, (torch.randn(300), torch.randn(400, 300)), {}),
    _conv_case(1, stride=2, padding=1),
    _conv_case(2, padding="same", dilation=2),
    _conv_case(2, padding="valid", groups=2, stride=(2, 1)),
    _conv_case(3, padding=(1, 0, 2)),
    (F.conv2d, (torch.randn(2, 4, 9, 9).to(memory_format=torch.channels_last),
                torch.randn(6, 4, 3, 3)), {"padding": 1}),
    (torch.matmul, (torch.randn(3, 1, 50, 40), torch.randn(4, 40, 30)), {}),
    (torch.Tensor.__matmul__, (torch.randn(50, 40), torch.randn(40, 30)), {}),
    (torch.mm, (torch.randn(50, 40), torch.randn(40, 60)), {}),
    (torch.bmm, (torch.randn(3, 50, 40), torch.randn(3, 40, 60)), {}),
    (torch.addmm, (torch.randn(60), torch.randn(50, 40), torch.randn(40, 60)), {}),
    (torch.baddbmm, (torch.randn(1, 50, 60), torch.randn(3, 50, 40), torch.randn(3, 40, 60)), {}),
    (F.scaled_dot_product_attention, (_q, _q, _q), {"is_causal": True}),
    (F.scaled_dot_product_attention, (_q.transpose(1, 2), _q.transpose(1, 2),
                                      _q.transpose(1, 2)), {}),
    (F.scaled_dot_product_attention, (_q, _q, _q), {"attn_mask": torch.ones(7, 7).bool()}),
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(_CASES)))
def test_a_skipped_op_gives_zeros_laid_out_as_the_op_does(case: int) -> None:
    func, args, kwargs = _CASES[case]
    with torch.no_grad():
        real, made = func(*args, **kwargs), skim.skipped(func, args, kwargs)
    assert made is not None and not made.any()
    assert (made.shape, made.stride(), made.dtype) == (real.shape, real.stride(), real.dtype)


@pytest.mark.parametrize(
    "options",
    [{"need_weights": False}, {}, {"average_attn_weights": False},
     {"key_padding_mask": torch.zeros(2, 9).bool()}],
)  # fmt: skip
def test_a_skipped_multi_head_attention_gives_its_outputs(options: dict[str, Any]) -> None:
    mha = nn.MultiheadAttention(32, 4).eval()
    x = torch.randn(9, 2, 32)
    found: list[Any] = []

    class Keep(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:  # fmt: skip
            if func is F.multi_head_attention_forward:
                found.append(skim.skipped(func, args, kwargs or {}))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Keep():
        real = mha(x, x, x, **options)
    (made,) = found
    for mine, theirs in zip(made, real, strict=True):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            assert (mine.shape, mine.stride()) == (theirs.shape, theirs.stride())


@pytest.mark.parametrize(
    ("func", "args"),
    [(F.linear, (torch.randn(5, 40), torch.randn(60, 41))),
     (F.conv2d, (torch.randn(1, 4, 2, 2), torch.randn(6, 4, 3, 3))),
     (F.conv2d, (torch.randn(1, 4, 9, 9), torch.randn(6, 4, 3, 3).double())),
     (torch.bmm, (torch.randn(3, 50, 40), torch.randn(2, 40, 60))),
     (torch.mm, (torch.randint(0, 9, (50, 40)), torch.randint(0, 9, (40, 60)))),
     (torch.mm, (torch.randn(50, 40).to_sparse(), torch.randn(40, 60))),
     (F.conv2d, (torch.randn(1, 4, 9, 9),
                 torch.randn(6, 4, 3, 3).to(memory_format=torch.channels_last)))],
)  # fmt: skip
def test_an_op_that_would_fail_is_computed(func: Any, args: tuple[Any, ...]) -> None:
    assert skim.skipped(func, args, {}) is None
