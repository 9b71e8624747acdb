"""Calibrated criteria by hand (Wanda, Taylor), the streaming statistics, the sequential
block driver, and the one-shot driver's checks and rollback, on small models."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
import prunekit.calibrate as cal
from helpers import distributed_calibration
from helpers.model_state import fingerprint
from prunekit.calibrate import statistics
from prunekit.criteria.grouped import GroupedRuns
from prunekit.whole import Config
from prunekit.whole.oneshot import run
from prunekit.whole.oneshot_plan import Loss, TensorRef


def oneshot(
    model: nn.Module,
    targets: list[TensorRef],
    amount: float,
    *,
    calibration: Any = None,
    loss: Loss | None = None,
    **fields: Any,
) -> None:
    """The one-shot engine on `targets`, with a Config of `amount` and `fields`."""
    run(model, targets, Config(amount=amount, **fields), calibration, loss)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = nn.Linear(width, 2 * width)
        self.b = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x))) * scale


class Tiny(nn.Module):
    """Embedding, blocks in a ModuleList, a head: the shape of a transformer."""

    def __init__(self, width: int = 8, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 20)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, scale=0.5)
        return self.head(x)


def linears(model: nn.Module) -> list[tuple[nn.Module, str]]:
    return [(m, "weight") for m in model.modules() if isinstance(m, nn.Linear)]


def batches(count: int = 3) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 20, (2, 5), generator=generator) for _ in range(count)]


def test_wanda_scores_by_hand() -> None:
    w = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    scores = prune.Wanda(torch.tensor([2.0, 0.1])).scores(w)
    assert torch.allclose(scores, torch.tensor([[2.0, 0.2], [6.0, 0.05]]))
    # Per row, Wanda keeps the large input even where the weight is small.
    got = prune.Pruning(0.5, prune.Wanda(torch.tensor([2.0, 0.1])), prune.PerRow()).prune(w)
    assert got.tolist() == [[1.0, 0.0], [3.0, 0.0]]


def test_wanda_norms_from_calibration_by_hand() -> None:
    layer = nn.Linear(2, 1)
    x1 = torch.tensor([[3.0, 0.0], [4.0, 1.0]])
    x2 = torch.tensor([[0.0, 2.0]])
    with cal.InputStatistics([layer], norms=True, hessian=True) as stats:
        for x in (x1, x2):
            stats.new_batch()
            layer(x)
    assert stats.norms(layer).tolist() == pytest.approx([5.0, 5**0.5])
    x = torch.cat([x1, x2])
    assert torch.allclose(stats.hessian(layer), x.T @ x / 3)


def test_linears_reading_one_input_share_statistics() -> None:
    q, k, v = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)
    with cal.InputStatistics([q, k, v], norms=False, hessian=True) as stats:
        for _ in range(2):
            stats.new_batch()
            x = torch.randn(3, 4)
            q(x), k(x), v(x + 1)
    assert stats.accumulators() == 2
    assert stats.hessian(q) is stats.hessian(k)


def test_targets_are_grouped_by_the_input_they_read() -> None:
    q, k, v, o = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 4)
    with cal.InputStatistics([q, k, v, o], norms=False, hessian=True) as stats:
        stats.new_batch()
        x = torch.randn(3, 4)
        q(x), o(x + 1), k(x), v(x)
    targets = [(q, "weight"), (o, "weight"), (k, "weight"), (v, "weight")]
    assert stats.sharing(targets) == [
        [(q, "weight"), (k, "weight"), (v, "weight")],
        [(o, "weight")],
    ]


def test_a_wide_input_s_hessian_is_the_mean_of_x_t_x_and_symmetric() -> None:
    """Summed in panels on and below the diagonal (`_PANEL` columns each), the upper
    triangle copied once read, read again after more batches too."""
    generator = torch.Generator().manual_seed(4)
    layer = nn.Linear(statistics._PANEL + 44, 2)  # two panels, the second narrower
    batches = [torch.randn(n, layer.in_features, generator=generator) for n in (5, 3, 7)]
    with cal.InputStatistics([layer], norms=False, hessian=True) as stats:
        for index, x in enumerate(batches):
            stats.new_batch()
            layer(x)
            seen = torch.cat(batches[: index + 1]).double()
            hessian = stats.hessian(layer)
            assert torch.equal(hessian, hessian.T)
            assert torch.allclose(hessian.double(), seen.T @ seen / len(seen), atol=1e-5)


class Attention(nn.Module):
    """Query, key and value read one input (one Hessian for SparseGPT)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) * self.k(x) + self.v(x)


def test_sparsegpt_on_layers_sharing_an_input_is_sparsegpt_on_each() -> None:
    from prunekit.core.amount import Amount
    from prunekit.criteria.sparsegpt import sparsegpt_prune

    torch.manual_seed(0)
    model = Attention()
    dense = {name: m.weight.detach().clone() for name, m in model.named_children()}
    batches = [torch.randn(5, 8) for _ in range(3)]
    x = torch.cat(batches)
    prune.prune_model(model, 0.5, method="sparsegpt", calibration=batches, pattern="2:4")
    for name, layer in model.named_children():
        keep, updated = sparsegpt_prune(
            dense[name], x.T @ x / len(x), Amount(0.5, "t"), prune.NM(2, 4)
        )
        assert torch.equal(layer.weight_mask.bool(), keep)
        assert torch.allclose(layer.weight, updated, atol=1e-5)


def test_a_shared_input_counts_once_in_the_first_batch_too() -> None:
    q, k, alone = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)
    x1, x2 = torch.tensor([[3.0, 0.0]]), torch.tensor([[0.0, 4.0]])
    with cal.InputStatistics([q, k, alone], norms=True, hessian=True) as stats:
        for x in (x1, x2):
            stats.new_batch()
            q(x), k(x), alone(x)
    for layer in (q, k):  # as for the layer reading the input alone
        assert stats.norms(layer).tolist() == stats.norms(alone).tolist() == [3.0, 4.0]
        assert torch.equal(stats.hessian(layer), stats.hessian(alone))


def test_taylor_scores_by_hand() -> None:
    layer = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[2.0, -1.0]]))
    data = [torch.tensor([[1.0, 3.0]]), torch.tensor([[-2.0, 1.0]])]
    # loss = w.x per batch, so grad = x and |w * grad| summed: |2*1|+|2*-2|, |-1*3|+|-1*1|.
    oneshot(
        layer,
        [(layer, "weight")],
        1,
        method="taylor",
        calibration=data,
        loss=lambda out, batch: out.sum(),
    )
    assert layer.weight_mask.tolist() == [[1.0, 0.0]]  # 6 against 4: the second goes
    assert layer.weight.requires_grad and layer.weight_orig.grad is None


def test_taylor_accumulates_over_batches() -> None:
    w = torch.tensor([[2.0, -1.0]])
    sal = prune.criteria.taylor.taylor_step(w, torch.tensor([[1.0, 3.0]]), None)
    sal = prune.criteria.taylor.taylor_step(w, torch.tensor([[-2.0, 1.0]]), sal)
    assert sal.tolist() == [[6.0, 4.0]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_taylor_of_a_half_precision_layer_ranks_as_in_float32(dtype: torch.dtype) -> None:
    """The first weight's |w * grad| is 1 in each of 511 batches, the second's 300 in one:
    a sum kept in bfloat16 stops at 256 and would prune the first."""
    layer = nn.Linear(2, 1, bias=False).to(dtype)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    data = [torch.tensor([[1.0, 0.0]], dtype=dtype)] * 511 + [
        torch.tensor([[0.0, 300.0]], dtype=dtype)
    ]
    oneshot(
        layer,
        [(layer, "weight")],
        1,
        method="taylor",
        calibration=data,
        loss=lambda out, batch: out.float().sum(),
    )
    assert layer.weight_mask.tolist() == [[1.0, 0.0]]  # 511 against 300: the second goes
    w = torch.full((1, 2), 1e-4, dtype=dtype)  # 1e-4 * 1e-4 is 0 in float16
    total = prune.criteria.taylor.taylor_step(w, torch.tensor([[1e-4, 0.0]], dtype=dtype), None)
    assert total.dtype == torch.float32 and float(total[0, 0]) > 0


def test_taylor_scores_of_a_bfloat16_tensor_are_not_rounded_to_ties() -> None:
    values = torch.ones(1, 2, dtype=torch.bfloat16)
    saliency = torch.tensor([[1.001, 1.0]])  # both 1.0 in bfloat16: a tie, the first would go
    pruning = prune.Pruning(1, criterion=prune.Taylor(saliency))
    assert pruning.prune(values).tolist() == [[1.0, 0.0]]


@pytest.mark.parametrize("saliency", [[[1.0, 2.0]], 3.0, {"fc": [[1.0, 2.0]]}])
def test_taylor_refuses_saliency_that_is_not_a_tensor(saliency: Any) -> None:
    with pytest.raises(TypeError, match=r"Taylor: invalid saliency .*of type (list|float); exp"):
        prune.Taylor(saliency)


def test_block_list_and_capture() -> None:
    model = Tiny()
    found = cal.block_list(model, [m for m, _ in linears(model)])
    assert found is not None and found[0] == "blocks"
    inputs = cal.capture_block_inputs(model, model.blocks[0], batches(2), owner="test")
    assert len(inputs) == 2 and inputs[0][1] == {"scale": 0.5}
    expected = model.blocks[0](*inputs[0][0], **inputs[0][1])
    assert torch.equal(cal.run_block(model.blocks[0], inputs[0], "test")[0][0], expected)


BY_BLOCKS: dict[str, Any] = {"pattern": "row", "sequential": True}


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_sequential_calibrates_each_block_on_the_pruned_ones_before(method: str) -> None:
    torch.manual_seed(0)
    model = Tiny()
    twin = Tiny()
    twin.load_state_dict(model.state_dict())
    seen: list[torch.Tensor] = []
    real = cal.block_statistics

    def spy(block: nn.Module, inputs: Any, modules: Any, *want: Any, **more: Any) -> Any:
        seen.append(inputs[0][0][0].clone())
        return real(block, inputs, modules, *want, **more)

    targets = [(b.a, "weight") for b in model.blocks] + [(b.b, "weight") for b in model.blocks]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cal, "block_statistics", spy)
        data = batches()  # block by block (sparsegpt's own default: 'layers')
        oneshot(model, targets, 0.5, method=method, calibration=data, **BY_BLOCKS)
    # Block 2's inputs are block 1's outputs after block 1 was pruned (not the dense ones).
    x = model.embed(batches()[0])
    with torch.no_grad():
        after_two = model.blocks[1](model.blocks[0](x, scale=0.5), scale=0.5)
        dense_two = twin.blocks[1](twin.blocks[0](twin.embed(batches()[0]), scale=0.5), scale=0.5)
    assert torch.allclose(seen[2], after_two)
    assert not torch.allclose(seen[2], dense_two)
    for module, _ in targets:
        assert module.weight_mask.sum(1).tolist() == [module.in_features / 2] * module.out_features


def test_sequential_and_one_pass_agree_on_the_first_block() -> None:
    one, two = Tiny(), Tiny()
    two.load_state_dict(one.state_dict())
    oneshot(one, linears(one), 0.5, method="wanda", calibration=batches(), sequential=True)
    oneshot(two, linears(two), 0.5, method="wanda", calibration=batches(), sequential=False)
    assert torch.equal(one.blocks[0].a.weight_mask, two.blocks[0].a.weight_mask)
    assert torch.equal(one.blocks[0].b.weight_mask, two.blocks[0].b.weight_mask)


def test_sparsegpt_changes_orig_and_keeps_the_parameter() -> None:
    model = Tiny()
    param = model.blocks[0].a.weight
    before = param.detach().clone()
    oneshot(model, linears(model), 0.5, method="sparsegpt", pattern="2:4", calibration=batches())
    layer = model.blocks[0].a
    assert layer.weight_orig is param
    keep = layer.weight_mask.bool()
    assert not torch.equal(param.detach()[keep], before[keep])  # updated
    assert torch.equal(param.detach()[~keep], before[~keep])  # pruned entries untouched
    assert int(layer.weight_mask.reshape(-1, 4).sum(1).max()) == 2


def test_global_wanda_ranks_all_layers_together() -> None:
    model = Tiny()
    oneshot(
        model,
        linears(model),
        0.5,
        method="wanda",
        scope="global",
        calibration=batches(),
        sequential=False,
    )
    total = sum(m.weight_mask.numel() for m, _ in linears(model))
    assert sum(int(m.weight_mask.sum()) for m, _ in linears(model)) == total - total // 2


@pytest.mark.parametrize("method", ["wanda", "taylor"])
def test_global_scores_that_are_not_finite_are_named_and_change_nothing(method: str) -> None:
    """Finite weights, but an input that is not: the scores hold NaN, the weights do not."""
    model = Tiny()
    with torch.no_grad():
        model.embed.weight[3, 1] = float("nan")
    before = fingerprint(model)
    loss = {"loss": lambda out, batch: out.sum()} if method == "taylor" else {}
    words = r"parameter 'weight' of Linear: the scores hold \d+ value\(s\) .*e\.g\. nan at index"
    with pytest.raises(ValueError, match=words):
        oneshot(
            model,
            linears(model)[:-1],
            0.5,
            method=method,
            scope="global",
            calibration=[torch.full((2, 5), 3)],
            sequential=False,
            **loss,
        )
    assert fingerprint(model) == before


@pytest.mark.parametrize("method", ["wanda", "taylor"])
@pytest.mark.parametrize("pattern", ["unstructured", "row", "2:4"])
def test_scores_that_are_not_finite_name_the_layer_and_the_entry(method: str, pattern: str) -> None:
    model = Tiny()
    with torch.no_grad():
        model.embed.weight[3, 1] = float("nan")
    before = fingerprint(model)
    loss = {"loss": lambda out, batch: out.sum()} if method == "taylor" else {}
    words = r"'blocks\.0\.a\.weight'.*the scores hold \d+ value\(s\) .*e\.g\. nan at index \("
    with pytest.raises(ValueError, match=words):
        prune.prune_model(
            model, 0.5, method=method, pattern=pattern, calibration=[torch.full((2, 5), 3)], **loss
        )
    assert fingerprint(model) == before


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_model_whose_every_layer_was_pruned_before_is_pruned_further(method: str) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    data = [torch.randn(4, 8) for _ in range(2)]
    prune.prune_model(model, 0.25, method=method, pattern="row", calibration=data)
    prune.prune_model(model, 0.5, method=method, pattern="row", calibration=data)
    for layer in (model[0], model[2]):  # 2 of each row's 8, then 3 of the 6 left
        assert layer.weight_mask.sum(dim=1).tolist() == [3.0] * 8


def test_l1_with_patterns_needs_no_calibration() -> None:
    model = Tiny()
    oneshot(model, linears(model)[:-1], 0.5, pattern="4:8")
    assert int(model.blocks[0].a.weight_mask.reshape(-1, 8).sum(1).max()) == 4


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"method": "sparsegpt"}, ValueError, "needs calibration data"),
        ({"method": "obs"}, ValueError, "invalid method='obs'"),
        ({"pattern": "2:4", "amount": 0.6}, ValueError, "expected amount=0.5"),
        ({"pattern": "diagonal"}, ValueError, "invalid pattern='diagonal'"),
        ({"pattern": "row", "scope": "global"}, ValueError, "scope='global'"),
        (
            {"method": "wanda", "scope": "global", "sequential": True, "calibration": "B"},
            ValueError,
            "sequential",
        ),
        ({"method": "wanda", "calibration": []}, ValueError, "holds no batch"),
        ({"method": "wanda", "calibration": [3]}, TypeError, "batch 0 is a int"),
        ({"method": "l1", "calibration": "B"}, ValueError, "uses no calibration"),
        ({"method": "taylor", "calibration": "B"}, ValueError, "needs a loss"),
        ({"method": "wanda", "calibration": "bad"}, ValueError, "cannot take batch 1"),
        ({"method": "sparsegpt", "calibration": "late"}, ValueError, "cannot take batch 1"),
    ],
)
def test_bad_calls_leave_the_model_as_it_was(
    kwargs: dict[str, Any], error: type, words: str
) -> None:
    model = Tiny()
    prune.l1_unstructured(model.blocks[1].a, "weight", 0.25)
    model.blocks[2].register_forward_pre_hook(_fail_on_width(4))
    before = fingerprint(model)
    data = batches()
    if kwargs.get("calibration") == "B":
        kwargs["calibration"] = data
    elif kwargs.get("calibration") == "bad":
        kwargs["calibration"] = [data[0], torch.randint(0, 20, (2, 5, 3)).float()]
    elif kwargs.get("calibration") == "late":
        # Fails in the last block only: after earlier blocks were pruned and updated.
        kwargs["calibration"] = [data[0], data[1][:, :4]]
    amount = kwargs.pop("amount", 0.5)
    with pytest.raises(error, match=words):
        oneshot(model, linears(model)[:-1], amount, **kwargs)
    assert fingerprint(model) == before


def _fail_on_width(width: int) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        if args[0].shape[1] == width:
            raise RuntimeError("boom")

    return hook


def test_non_linear_targets_are_refused_for_calibrated_methods() -> None:
    model = Tiny()
    with pytest.raises(ValueError, match="calibrates the weight matrices of Linear"):
        oneshot(model, [(model.embed, "weight")], 0.5, method="wanda", calibration=batches())
    assert not prune.is_pruned(model)


def test_progress_bar_goes_to_the_stream() -> None:
    import io

    from prunekit.progress import Progress

    stream = io.StringIO()
    bar = Progress("wanda", 2, True, stream)
    bar.advance()
    bar.advance()
    bar.close()
    assert "2/2" in stream.getvalue() and stream.getvalue().endswith("\n")


class Head(nn.Module):
    """A language model's shape: blocks, then a head (found as get_output_embeddings)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = Tiny()
        self.lm_head = nn.Linear(20, 12)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(self.body(ids))
        return out


@pytest.mark.parametrize("method", ["wanda", "sparsegpt", "taylor"])
def test_prune_model_calibrated_skips_embeddings_and_head(method: str) -> None:
    model = Head()
    loss = (lambda out, batch: out.square().mean()) if method == "taylor" else None
    found = prune.prune_model(
        model, 0.5, method=method, pattern="2:4", calibration=batches(), loss=loss
    )
    masked = [r.name for r in found.rows if r.masked]
    assert "lm_head.weight" not in masked and "body.embed.weight" not in masked
    assert "body.head.weight" in masked  # Tiny's own last Linear is no output head here
    assert sum(1 for name in masked if name.startswith("body.blocks.")) == 6
    for name in masked:
        assert found[name].sparsity == 0.5


def test_prune_model_patterns_with_l1_and_its_errors() -> None:
    model = Tiny()
    found = prune.prune_model(model, 0.5, pattern="row", exclude="embed.*")
    assert found["blocks.0.a.weight"].sparsity == 0.5
    assert model.blocks[0].a.weight_mask.sum(1).tolist() == [4.0] * 16
    with pytest.raises(ValueError, match="method='ln' takes no pattern"):
        prune.prune_model(Tiny(), 0.5, method="ln", pattern="2:4")
    with pytest.raises(ValueError, match="wanda, sparsegpt, taylor"):
        prune.prune_model(Tiny(), 0.5, method="obs")
    fresh = Tiny()
    before = fingerprint(fresh)
    with pytest.raises(ValueError, match=r"expected amount=0\.5"):
        prune.prune_model(fresh, 0.7, method="sparsegpt", pattern="2:4", calibration=batches())
    with pytest.raises(ValueError, match="needs calibration data"):
        prune.prune_model(fresh, 0.5, method="wanda")
    assert fingerprint(fresh) == before


def masks_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if k.endswith("_mask")}


def test_wanda_prunes_per_row_unless_told_otherwise() -> None:
    """Wanda's paper ranks within each output row: that is its default pattern; an explicit
    'unstructured' ranks the whole layer, and scope='global' ranks across layers."""
    models = {}
    for pattern in (None, "row", "unstructured"):
        torch.manual_seed(0)
        models[pattern] = Tiny()
        kwargs = {} if pattern is None else {"pattern": pattern}
        prune.prune_model(models[pattern], 0.5, method="wanda", calibration=batches(), **kwargs)
    default, row, whole = (masks_of(models[p]) for p in (None, "row", "unstructured"))
    assert default.keys() == row.keys() and len(default) == 7
    for key, mask in default.items():
        assert torch.equal(mask, row[key]), key
        assert mask.sum(1).unique().numel() == 1, key  # every row keeps the same count
    # Ranked over the whole layer, rows keep different counts somewhere.
    assert any(mask.sum(1).unique().numel() > 1 for mask in whole.values())
    masks = []
    for pattern in (None, "unstructured"):
        torch.manual_seed(0)
        model = Tiny()
        kwargs = {} if pattern is None else {"pattern": pattern}
        prune.prune_model(
            model,
            0.5,
            method="wanda",
            scope="global",
            sequential=False,
            calibration=batches(),
            **kwargs,
        )
        masks.append(masks_of(model))
    assert masks[0].keys() == masks[1].keys()
    assert all(torch.equal(masks[0][k], masks[1][k]) for k in masks[0])


def test_other_methods_stay_unstructured_by_default() -> None:
    for method in ("l1", "sparsegpt"):
        found = []
        for pattern in (None, "unstructured"):
            torch.manual_seed(0)
            model = Tiny()
            kwargs: dict[str, Any] = {} if pattern is None else {"pattern": pattern}
            if method != "l1":
                kwargs["calibration"] = batches()
            prune.prune_model(model, 0.5, method=method, **kwargs)
            found.append(masks_of(model))
        assert found[0].keys() == found[1].keys() and found[0]
        assert all(torch.equal(found[0][k], found[1][k]) for k in found[0]), method


class CalledTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(self.a(x)))


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_layer_called_twice_per_batch_is_named_so(method: str) -> None:
    model = CalledTwice()
    before = fingerprint(model)
    with pytest.raises(
        ValueError, match=r"module 'a' \(Linear\) was called more than once per batch"
    ):
        prune.prune_model(model, 0.5, method=method, calibration=[torch.randn(3, 4)])
    assert fingerprint(model) == before


@pytest.mark.parametrize(
    ("loss", "found"),
    [
        (lambda out, _: out, r"a tensor of shape \(3, 2\)"),
        (lambda out, _: out.sum().long(), "a tensor of dtype torch.int64"),
        (lambda out, _: out.sum().detach(), r"a tensor that does not require grad \(detached.*\)"),
        (lambda out, _: None, r"a NoneType \(None\)"),
    ],
)
def test_a_taylor_loss_no_gradient_can_flow_from_is_named(loss: Any, found: str) -> None:
    model = CalledTwice()
    before = fingerprint(model)
    expected = rf"loss\(output, batch\) returned {found} on batch 0.*scalar floating tensor"
    with pytest.raises(ValueError, match=expected + ".*requires grad"):
        prune.prune_model(model, 0.5, method="taylor", calibration=[torch.randn(3, 4)], loss=loss)
    assert fingerprint(model) == before


class AttentionBlock(nn.Module):
    """Query, key and value read one input; the output projection reads what they make."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.o = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.o(self.q(x) * self.k(x) + self.v(x))


class Attentive(nn.Module):
    def __init__(self, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.blocks = nn.ModuleList(AttentionBlock() for _ in range(depth))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return x


def _wanda_row_mask(layer: nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
    """The mask Wanda per row gives `layer` from the rows of `inputs`, by hand."""
    norms = inputs.reshape(-1, inputs.shape[-1]).double().square().sum(0).sqrt().float()
    scores = layer.weight.detach().abs() * norms
    keep = torch.ones_like(scores)
    order = torch.sort(scores, dim=1, stable=True).indices[:, : scores.shape[1] // 2]
    return keep.scatter_(1, order, 0.0)


def test_layers_calibrates_each_layer_on_the_pruned_one_before() -> None:
    torch.manual_seed(0)
    model, twin = Tiny(), Tiny()
    twin.load_state_dict(model.state_dict())
    data = batches()
    prune.prune_model(model, 0.5, method="wanda", calibration=data, sequential="layers")
    prune.prune_model(twin, 0.5, method="wanda", calibration=data, sequential=True)
    block = model.blocks[0]
    with torch.no_grad():
        x = torch.cat([model.embed(b) for b in data])
        pruned = torch.relu(block.a(x))  # what b reads once a is pruned
    assert torch.equal(block.a.weight_mask, twin.blocks[0].a.weight_mask)  # the first group
    assert torch.equal(block.a.weight_mask, _wanda_row_mask(block.a, x))
    assert torch.equal(block.b.weight_mask, _wanda_row_mask(block.b, pruned))
    # The one-group-per-block run calibrated b on the dense a: another mask here.
    assert not torch.equal(block.b.weight_mask, twin.blocks[0].b.weight_mask)


def test_layers_groups_layers_reading_one_input_and_computes_each_layer_once_a_batch() -> None:
    model = Attentive()
    computed = {name: 0 for name in "qkvo"}
    for name in "qkvo":  # counts each forward computed (not the calls answered from memory)
        layer = getattr(model.blocks[0], name)
        real = layer.forward

        def counted(x: torch.Tensor, n: str = name, real: Any = real) -> torch.Tensor:
            computed[n] += 1
            out: torch.Tensor = real(x)
            return out

        layer.forward = counted
    groups: list[list[nn.Module]] = []
    real_group = GroupedRuns.next_group

    def spy(self: GroupedRuns, modules: Any) -> Any:
        stats, group = real_group(self, modules)
        groups.append(group)
        return stats, group

    data = batches()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GroupedRuns, "next_group", spy)
        prune.prune_model(model, 0.5, method="sparsegpt", calibration=data, sequential="layers")
    first = model.blocks[0]
    assert groups[:2] == [[first.q, first.k, first.v], [first.o]] and len(groups) == 4
    # q, k, v: finding their group on the first batch (each later run stops before q),
    # then pruned, for o's input; o, the only layer left, is its group without a run, then
    # pruned, for the next block's inputs (q, k and v's outputs kept from o's runs).
    n = len(data)
    assert computed == {"q": 1 + n, "k": 1 + n, "v": 1 + n, "o": n}
    for name in "qkvo":
        assert float(getattr(first, name).weight_mask.mean()) == 0.5
        assert "forward" in vars(getattr(first, name))  # its own forward, given back


@pytest.mark.parametrize(
    ("value", "error"), [("blocks", ValueError), (1, TypeError), (1.0, TypeError)]
)
def test_a_bad_sequential_is_named_and_changes_nothing(value: Any, error: type) -> None:
    model = Tiny()
    before = fingerprint(model)
    expected = rf"prune_model: invalid sequential={value!r}; expected True .* or 'layers'"
    with pytest.raises(error, match=expected):
        prune.prune_model(model, 0.5, method="sparsegpt", calibration=batches(), sequential=value)
    assert fingerprint(model) == before


def test_layers_failing_in_a_later_block_leaves_the_model_as_it_was() -> None:
    model = Tiny()
    model.blocks[2].register_forward_pre_hook(_fail_on_width(4))
    before = fingerprint(model)
    data = batches()
    late = [data[0], data[1][:, :4]]  # fails in the last block, after two were pruned
    with pytest.raises(ValueError, match="cannot take batch 1"):
        prune.prune_model(model, 0.5, method="sparsegpt", calibration=late, sequential="layers")
    assert fingerprint(model) == before


def test_layers_calibrates_a_layer_the_first_batches_do_not_run() -> None:
    model = distributed_calibration.build()
    generator = torch.Generator().manual_seed(3)
    width = distributed_calibration.WIDTH
    data = [torch.randn(n, 3, width, generator=generator) for n in (4, 2, 5)]  # expert: last
    prune.prune_model(model, 0.5, method="sparsegpt", calibration=data, sequential="layers")
    for block in model.blocks:
        assert float(block.expert.weight_mask.mean()) == 0.5


def test_wanda_norms_are_the_float64_root_of_the_float64_sums() -> None:
    # Squares summing to 2: the norm is sqrt(2) in float64, not its float32 rounding
    # (which would reorder Wanda scores that differ by less than float32 resolves).
    layer = nn.Linear(2, 1)
    with cal.InputStatistics([layer], norms=True, hessian=False) as stats:
        for x in (torch.tensor([[1.0, 3.0]]), torch.tensor([[1.0, 0.0]])):
            stats.new_batch()
            layer(x)
    norms = stats.norms(layer)
    assert norms.dtype == torch.float64
    # torch's own float64 root (within 1 ulp of the correctly rounded one, by CPU kind)
    assert norms.tolist() == torch.tensor([2.0, 9.0], dtype=torch.float64).sqrt().tolist()
    assert float(norms[0]) != float(torch.tensor(2.0).sqrt())  # not float32's


class Counted(nn.Module):
    """A Linear that counts its calls (its output computed or not)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out: torch.Tensor = self.inner(x)
        return out


def _full_statistics(model: nn.Module, data: list[Any], modules: list[nn.Module]) -> Any:
    with torch.no_grad(), cal.Wanted(norms=True, hessian=True).gather(modules) as stats:
        for batch in data:
            stats.new_batch()
            model(batch)
    return stats


def test_calibration_ends_each_later_run_once_every_layer_took_its_input() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), Counted(4), nn.Tanh(), Counted(4))
    data = [torch.randn(3, 4) for _ in range(4)]
    targets = [model[0], model[2].inner]
    expected = _full_statistics(model, data, targets)
    model[2].calls = model[4].calls = 0
    stats = cal.calibrate(model, data, targets, cal.Wanted(norms=True, hessian=True), owner="test")
    # the first batch runs whole; each later one stops before the last target computes
    assert (model[2].calls, model[4].calls) == (4, 1)
    for m in targets:
        assert stats.rows(m) == expected.rows(m) == 12
        assert torch.equal(stats.norms(m), expected.norms(m))
        assert torch.equal(stats.hessian(m), expected.hessian(m))


class Swallows(nn.Module):
    """Calls its layer inside a try that swallows every Exception, then calls it again."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.after = Counted(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            y = self.layer(x)
        except Exception:
            y = self.layer(x)  # a fallback path: the same layer, called again
        return self.after(y)


def test_a_run_that_swallows_the_stop_goes_on_and_takes_nothing_twice() -> None:
    torch.manual_seed(0)
    model = Swallows()
    data = [torch.randn(3, 4) for _ in range(3)]
    expected = _full_statistics(model, data, [model.layer])
    model.after.calls = 0
    stats = cal.calibrate(
        model, data, [model.layer], cal.Wanted(norms=True, hessian=False), owner="test"
    )
    assert model.after.calls == 3  # every run went on past the stop
    assert stats.rows(model.layer) == 9
    assert torch.equal(stats.norms(model.layer), expected.norms(model.layer))


class Branch(nn.Module):
    """`late` runs only on batches whose first entry is positive."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.late = nn.Linear(4, 4)
        self.tail = Counted(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.first(x)
        if float(x.flatten()[0]) > 0:
            y = self.late(y)
        return self.tail(y)


def test_a_layer_the_first_batch_does_not_run_is_still_calibrated() -> None:
    model = Branch()
    data = [-torch.ones(2, 4), torch.ones(2, 4), torch.ones(2, 4)]
    stats = cal.calibrate(
        model, data, [model.first, model.late], cal.Wanted(True, False), owner="test"
    )
    assert model.tail.calls == 3  # no run ended early: the first did not call `late`
    assert stats.rows(model.first) == 6 and stats.rows(model.late) == 4


def test_block_statistics_end_each_later_run_at_the_last_layer_s_input() -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), Counted(4), Counted(4))
    inputs: list[cal.Inputs] = [((torch.randn(2, 4),), {}) for _ in range(3)]
    targets = [block[0], block[1].inner]
    expected = _full_statistics(block, [i[0][0] for i in inputs], targets)
    block[1].calls = block[2].calls = 0
    stats = cal.block_statistics(block, inputs, targets, cal.Wanted(True, True), owner="test")
    assert (block[1].calls, block[2].calls) == (3, 1)
    for m in targets:
        assert torch.equal(stats.hessian(m), expected.hessian(m))


def _flags(model: nn.Module) -> list[bool]:
    return [p.requires_grad for p in model.parameters()]


def test_requiring_grad_restores_flags_and_grads_after_an_error() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    chosen, frozen = model[0].weight, model[1].bias
    frozen.requires_grad_(False)
    old = torch.ones(3, 3)
    chosen.grad = old
    inside = cal.requiring_grad(model, [chosen], restore_grads=True)
    with pytest.raises(RuntimeError, match="inside"), inside:
        assert _flags(model) == [True, False, False, False]
        assert chosen.grad is None  # starts afresh
        model(torch.randn(2, 3)).sum().backward()
        assert chosen.grad is not None and model[0].bias.grad is None
        raise RuntimeError("inside")
    assert _flags(model) == [True, True, True, False]
    assert chosen.grad is old
    assert all(p.grad is None for p in list(model.parameters())[1:])


def test_requiring_grad_without_restore_grads_leaves_the_grads_it_made() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    old = torch.ones(3, 3)
    model[0].weight.grad = old
    chosen = model[1].weight
    with cal.requiring_grad(model, [chosen]):
        assert _flags(model) == [False, False, True, False]
        assert model[0].weight.grad is old  # not touched
        model(torch.randn(2, 3)).sum().backward()
    assert _flags(model) == [True, True, True, True]
    assert model[0].weight.grad is old and chosen.grad is not None
