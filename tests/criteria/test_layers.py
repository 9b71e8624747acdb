"""Calibrated pruning (Wanda, SparseGPT, Taylor) of every layer that holds its weight as a
matrix: Hugging Face's Conv1D (GPT-2), convolutions (grouped and depthwise: one matrix per
group) and MultiheadAttention's in_proj_weight, each checked against a plain reference:
the same weights as Linears, pruned by the Linear path."""

from __future__ import annotations

import re

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

import prunekit as prune
from helpers.model_state import fingerprint

PATTERNS = [("unstructured", 0.5), ("row", 0.5), ("2:4", 0.5)]


def mask(module: nn.Module, name: str = "weight") -> Tensor:
    found: Tensor = getattr(module, f"{name}_mask")
    return found


# -- convolutions against the same weights as Linears over the input's patches ---------


class Unfolded(nn.Module):
    """A convolution as one Linear per group over its input's patches (given as (N, rows,
    groups, columns), columns ordered kernel position first, channel last). Calibrated with
    sequential=False: its linears are no sequence of blocks."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        groups = conv.groups
        out = conv.weight.shape[0]
        moved = conv.weight.detach().movedim(1, -1).reshape(groups, out // groups, -1)
        self.linears = nn.ModuleList(
            nn.Linear(moved.shape[2], moved.shape[1], bias=False) for _ in range(groups)
        )
        for linear, weight in zip(self.linears, moved, strict=True):
            linear.weight.data = weight.clone()

    def forward(self, patches: Tensor) -> Tensor:
        return torch.cat([lin(patches[:, :, g]) for g, lin in enumerate(self.linears)], dim=-1)

    def weight(self, name: str, conv: nn.Conv2d) -> Tensor:
        """The linears' `name` tensors as the conv weight's shape."""
        out, per, *kernel = conv.weight.shape
        stacked = torch.stack([getattr(lin, name) for lin in self.linears])
        return stacked.reshape(out, *kernel, per).movedim(-1, 1)


def patches(conv: nn.Conv2d, x: Tensor) -> Tensor:
    """torch's F.unfold, reordered to (N, positions, groups, kernel x channels per group)."""
    kh, kw = conv.kernel_size
    cols = F.unfold(x, (kh, kw), dilation=conv.dilation, padding=conv.padding, stride=conv.stride)
    n, _, rows = cols.shape
    per = conv.in_channels // conv.groups
    cols = cols.reshape(n, conv.groups, per, kh * kw, rows)  # channel-major in F.unfold
    return cols.permute(0, 4, 1, 3, 2).reshape(n, rows, conv.groups, kh * kw * per)


CONVS = {
    "plain": dict(in_channels=8, out_channels=6, kernel_size=3, padding=1),
    "grouped": dict(in_channels=8, out_channels=6, kernel_size=3, padding=1, groups=2, stride=2),
    "depthwise": dict(in_channels=8, out_channels=8, kernel_size=(3, 2), groups=8, dilation=2),
}


def test_the_reference_is_the_convolution() -> None:
    for kwargs in CONVS.values():
        conv = nn.Conv2d(**kwargs, bias=False)  # type: ignore[arg-type]
        x = torch.randn(2, 8, 9, 9)
        out = conv(x)
        flat = Unfolded(conv)(patches(conv, x))
        assert torch.allclose(out.flatten(2).transpose(1, 2), flat, atol=1e-5)


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize(("pattern", "amount"), PATTERNS)
@pytest.mark.parametrize("kind", list(CONVS))
def test_a_convolution_prunes_as_its_unfolded_linears(
    kind: str, pattern: str, amount: float, method: str
) -> None:
    if pattern == "2:4" and kind == "depthwise":
        pytest.skip("one input channel per group: no 4 to choose 2 of")
    conv = nn.Conv2d(**CONVS[kind], bias=False)  # type: ignore[arg-type]
    batches = [torch.randn(2, 8, 9, 9) for _ in range(3)]
    reference = Unfolded(conv)
    ref_batches = [patches(conv, x) for x in batches]
    scope = "layer"
    if pattern == "unstructured" and method == "wanda":
        scope = "global"  # one ranking over the groups, as over the conv's one tensor
    prune.prune_model(
        reference, amount, method=method, pattern=pattern, calibration=ref_batches, scope=scope,
        sequential=False,
    )  # fmt: skip
    model = nn.Sequential(conv)
    prune.prune_model(model, amount, method=method, pattern=pattern, calibration=batches)
    expected = reference.weight("weight_mask", conv)
    assert torch.equal(mask(conv), expected)
    assert float(mask(conv).mean()) == pytest.approx(1 - amount, abs=0.05)
    if method == "sparsegpt":  # the weights left are updated the same way
        updated = reference.weight("weight_orig", conv)
        assert torch.allclose(conv.weight_orig * mask(conv), updated * expected, atol=1e-5)


@pytest.mark.parametrize("amount", [0.5, 0.3])
def test_sparsegpt_prunes_the_count_asked_of_a_grouped_convolution(amount: float) -> None:
    """Nine entries per group: each group rounding its own share alone (4 of 9 at 0.5,
    3 of 9 at 0.3) would miss the tensor's count by up to half an entry per group."""
    model = nn.Sequential(nn.Conv2d(8, 8, 3, groups=8, bias=False))
    prune.l1_unstructured(model[0], "weight", amount=3)  # entries pruned before do not count
    batches = [torch.randn(2, 8, 9, 9) for _ in range(2)]
    prune.prune_model(model, amount, method="sparsegpt", calibration=batches)
    pruned_now = 72 - 3 - int(mask(model[0]).sum())
    assert pruned_now == round(amount * (72 - 3))


@pytest.mark.parametrize(
    "pattern", [prune.NM(2, 4, dim=-1), prune.PerRow(dim=-2), prune.PerRow(dim=2)]
)
def test_sparsegpt_refuses_a_convolution_pattern_along_another_dim(pattern: prune.Pattern) -> None:
    """Its matrix has the filters as rows and the input channels grouped in its columns:
    a pattern along the kernel would be pruned along those instead."""
    model = nn.Sequential(nn.Conv1d(4, 4, 8))
    before = fingerprint(model)
    with pytest.raises(ValueError, match=rf"'0\.weight'.*{re.escape(repr(pattern))} does not fit"):
        prune.prune_model(
            model, 0.5, method="sparsegpt", pattern=pattern, calibration=[torch.randn(2, 4, 20)]
        )
    assert fingerprint(model) == before


@pytest.mark.parametrize("dims", [1, 3])
def test_conv1d_and_conv3d_prune_with_patches(dims: int) -> None:
    cls = {1: nn.Conv1d, 3: nn.Conv3d}[dims]
    conv = cls(4, 6, kernel_size=3, padding="same", groups=2, padding_mode="reflect")
    size = (7,) * dims
    batches = [torch.randn(2, 4, *size) for _ in range(2)]
    prune.prune_model(nn.Sequential(conv), 0.5, method="sparsegpt", calibration=batches)
    assert float(mask(conv).mean()) == 0.5
    model = nn.Sequential(cls(4, 8, kernel_size=3))
    prune.prune_model(model, 0.5, method="wanda", pattern="2:4", calibration=batches)
    kept = mask(model[0]).movedim(1, -1).reshape(-1, 4).sum(dim=1)
    assert torch.equal(kept, torch.full_like(kept, 2))


# -- Hugging Face's Conv1D: a Linear's weight, transposed --------------------------------

transformers = pytest.importorskip("transformers")
Conv1D = transformers.pytorch_utils.Conv1D


@pytest.mark.parametrize("method", ["wanda", "sparsegpt", "taylor"])
@pytest.mark.parametrize(("pattern", "amount"), PATTERNS)
def test_hf_conv1d_prunes_as_the_linear_it_transposes(
    method: str, pattern: str, amount: float
) -> None:
    conv = Conv1D(12, 16)  # nf=12 outputs, nx=16 inputs: weight (16, 12)
    nn.init.normal_(conv.weight)
    linear = nn.Linear(16, 12)
    linear.weight.data = conv.weight.detach().T.clone()
    linear.bias.data = conv.bias.detach().clone()
    batches = [torch.randn(4, 5, 16) for _ in range(2)]
    loss = {"loss": lambda out, batch: out.pow(2).mean()} if method == "taylor" else {}
    for layer in (conv, linear):
        prune.prune_model(
            nn.Sequential(layer), amount, method=method, pattern=pattern, calibration=batches,
            **loss,
        )  # fmt: skip
    assert torch.equal(mask(conv), mask(linear).T)
    assert torch.allclose(conv.weight, linear.weight.T, atol=1e-5)
    if pattern == "2:4":  # along the input: dim 0 of Conv1D's weight
        assert (mask(conv).reshape(4, 4, 12).sum(dim=1) == 2).all()


def test_hf_conv1d_s_weight_that_is_not_finite_is_named_at_its_own_index() -> None:
    model = nn.Sequential(Conv1D(8, 4))  # weight (4 inputs, 8 outputs)
    with torch.no_grad():
        model[0].weight[1, 6] = float("nan")
    with pytest.raises(ValueError, match=r"'0\.weight'.*e\.g\. nan at index \(1, 6\)"):
        prune.prune_model(model, 0.5, method="sparsegpt", calibration=[torch.randn(5, 4)])
    assert not prune.is_pruned(model)


def gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4, n_inner=64
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize(("pattern", "amount"), [("unstructured", 0.5), ("2:4", 0.5)])
def test_gpt2_calibrates(method: str, pattern: str, amount: float) -> None:
    model = gpt2()
    batches = [torch.randint(0, 64, (2, 12)) for _ in range(2)]
    found = prune.prune_model(model, amount, method=method, pattern=pattern, calibration=batches)
    names = [row.name for row in found.rows if row.masked]
    assert sorted(names) == sorted(
        f"transformer.h.{i}.{n}.weight"
        for i in range(2)
        for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    )
    for name in names:
        assert found[name].sparsity == 0.5
    if pattern == "2:4":
        weight = model.transformer.h[0].attn.c_attn.weight  # (in 32, out 96)
        assert (weight.reshape(8, 4, 96).ne(0).sum(dim=1) <= 2).all()
    with torch.no_grad():
        assert torch.isfinite(model(batches[0]).logits).all()


# -- MultiheadAttention's fused in_proj_weight -------------------------------------------


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.attn(x, x, x, need_weights=False)[0]
        return out


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_in_proj_weight_prunes_as_one_linear(method: str) -> None:
    model = SelfAttention()
    linear = nn.Linear(16, 48)
    linear.weight.data = model.attn.in_proj_weight.detach().clone()
    batches = [torch.randn(2, 5, 16) for _ in range(2)]
    prune.prune_model(model, 0.5, method=method, calibration=batches)
    prune.prune_model(nn.Sequential(linear), 0.5, method=method, calibration=batches)
    assert torch.equal(mask(model.attn, "in_proj_weight"), mask(linear))
    assert torch.allclose(model.attn.in_proj_weight, linear.weight, atol=1e-5)
    # out_proj too, on its own input (the heads' output): see tests/whole/test_attention_out_proj.py
    assert float(mask(model.attn.out_proj).mean()) == 0.5


def test_cross_attention_in_proj_is_refused_and_nothing_changes() -> None:
    class Cross(SelfAttention):
        def forward(self, x: Tensor) -> Tensor:
            out: Tensor = self.attn(x, x.flip(1), x, need_weights=False)[0]
            return out

    model = Cross()
    before = fingerprint(model)
    with pytest.raises(ValueError, match="in_proj_weight is calibrated on self-attention"):
        prune.prune_model(model, 0.5, method="wanda", calibration=[torch.randn(2, 5, 16)])
    assert fingerprint(model) == before


def test_grouped_sparsegpt_refuses_a_count() -> None:
    model = nn.Sequential(nn.Conv2d(4, 4, 3, groups=2))
    with pytest.raises(ValueError, match=r"2 groups.*fraction, not the count 3"):
        prune.prune_model(model, 3, method="sparsegpt", calibration=[torch.randn(1, 4, 5, 5)])
    assert not prune.is_pruned(model)
