"""Hostile cases of SparseGPT's memory changes (criteria.hessian.damp_, inverse_factor's
in_place, sparsegpt_prune_shared's spend_hessian, the refit's buffers): the sweep against a
plain column-by-column reference written here, NaN and inf Hessians, inputs that never
fired, one-column and one-row layers, half-precision weights, and prune_model's in-place
path against the copying one on the very Hessian it used."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import prunekit as prune
import prunekit.whole.oneshot_execute as oneshot_execute
from prunekit.core.amount import Amount
from prunekit.criteria.hessian import damp_, damped, inverse_factor
from prunekit.criteria.sparsegpt import SparseGPT, sparsegpt_prune, sparsegpt_prune_shared
from prunekit.patterns import NM, Unstructured
from prunekit.whole.config import Config

Pair = tuple[torch.Tensor, torch.Tensor]


def hessian_of(
    cols: int, rows: int = 64, dead: tuple[int, ...] = (), seed: int = 0
) -> torch.Tensor:
    """The mean of X^T X of `rows` random inputs (float64), the `dead` inputs always 0."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    x[:, list(dead)] = 0
    return x.T @ x / rows


def reference(
    weight: torch.Tensor, hessian: torch.Tensor, per_block: int, blocksize: int, damp: float
) -> Pair:
    """SparseGPT as its paper states it, one column at a time in float64: H damped (an input
    that never fired gets 1 on the diagonal first), U the upper Cholesky factor of H^-1; at
    the start of each block the `per_block` entries of least w^2 / U_jj^2 (0 for a dead
    input) are pruned, and each column's error is spread over every later column."""
    w = weight.to(torch.float64).clone()
    h = hessian.to(torch.float64).clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1
    h += damp * h.diagonal().mean() * torch.eye(h.shape[0], dtype=h.dtype)
    upper = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    pruned = torch.zeros(w.shape, dtype=torch.bool)
    for start in range(0, w.shape[1], blocksize):
        stop = min(w.shape[1], start + blocksize)
        saliency = w[:, start:stop] ** 2 / upper.diagonal()[start:stop] ** 2
        saliency[:, dead[start:stop]] = 0
        flat = torch.zeros(saliency.numel(), dtype=torch.bool)
        flat[torch.sort(saliency.reshape(-1), stable=True).indices[:per_block]] = True
        pruned[:, start:stop] = flat.reshape(saliency.shape)
        for j in range(start, stop):
            error = w[:, j] * pruned[:, j] / upper[j, j]
            w[:, j:] -= torch.outer(error, upper[j, j:])
            w[pruned[:, j], j] = 0
    return ~pruned, w


def run(weight: torch.Tensor, hessian: torch.Tensor, amount: float, blocksize: int,
        refit: int = 0, damp: float = 0.1, pattern: Any = None) -> Pair:  # fmt: skip
    settings = SparseGPT(damp=damp, blocksize=blocksize, refit=refit)
    return sparsegpt_prune(weight, hessian, Amount(amount, "SparseGPT"),
                           pattern or Unstructured(), settings=settings)  # fmt: skip


@pytest.mark.parametrize("dead", [(), (5,), (0, 11)])
@pytest.mark.parametrize("blocksize", [4, 12])
def test_the_sweep_is_the_column_by_column_reference(dead: tuple[int, ...], blocksize: int) -> None:
    torch.manual_seed(1)
    weight = torch.randn(6, 12, dtype=torch.float64)
    hessian = hessian_of(12, dead=dead)
    keep, updated = run(weight, hessian, 0.5, blocksize)
    want_keep, want = reference(weight, hessian, 36 * blocksize // 12, blocksize, 0.1)
    assert torch.equal(keep, want_keep)
    torch.testing.assert_close(updated, want, rtol=1e-10, atol=1e-12)
    assert bool((updated[~keep] == 0).all())
    for column in dead:  # a dead input's error reaches no other column
        assert not bool(keep[:, column].any())


def test_the_refit_reaches_each_row_s_least_squares_given_the_mask() -> None:
    torch.manual_seed(2)
    weight = torch.randn(5, 10, dtype=torch.float64)
    hessian = hessian_of(10, dead=(3,))
    keep, updated = run(weight, hessian, 0.5, 10, refit=10)
    h = damped(hessian, 0.1)
    for row in range(5):
        free, fixed = keep[row], ~keep[row]
        # least (w - w0) H (w - w0)^T with w = 0 where fixed: w_F = w0_F + H_FF^-1 H_FP w0_P
        solve = torch.linalg.solve(h[free][:, free], h[free][:, fixed] @ weight[row, fixed])
        want = weight[row, free] + solve
        torch.testing.assert_close(updated[row, free], want, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("refit", [0, 10])
@pytest.mark.parametrize("pattern", [None, NM(2, 4)])
def test_spending_the_hessian_changes_no_result_and_leaves_it_damped(
    refit: int, pattern: Any
) -> None:
    torch.manual_seed(3)
    weights = [torch.randn(4, 16), torch.randn(3, 16)]
    hessian = hessian_of(16, dead=(2, 9)).float()
    spent = hessian.clone()
    settings = SparseGPT(blocksize=8, refit=refit)
    kind = pattern or Unstructured()
    amount = Amount(0.5, "SparseGPT")
    kept = sparsegpt_prune_shared(weights, hessian, amount, kind, settings=settings)
    assert torch.equal(hessian, hessian_of(16, dead=(2, 9)).float())  # not spent: unchanged
    got = sparsegpt_prune_shared(weights, spent, amount, kind, settings=settings,
                                 spend_hessian=True)  # fmt: skip
    for (k1, u1), (k2, u2) in zip(kept, got, strict=True):
        assert torch.equal(k1, k2) and torch.equal(u1, u2)
    assert torch.equal(spent, damped(hessian, 0.1))


def test_damp_in_place_is_damped_and_returns_its_argument() -> None:
    hessian = hessian_of(7, dead=(0, 6)).float()
    want = damped(hessian, 0.25)
    same = damp_(hessian, 0.25)
    assert same is hessian and torch.equal(hessian, want)
    assert hessian[0, 0] > 1 and hessian[0, 1:].eq(0).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("in_place", [False, True])
def test_a_non_finite_hessian_is_refused_by_name_and_left_as_it_was(
    bad: float, in_place: bool
) -> None:
    hessian = hessian_of(6).float()
    hessian[2, 3] = hessian[3, 2] = bad
    before = hessian.clone()
    with pytest.raises(ValueError) as raised:
        inverse_factor(hessian, 0.1, "owner.path", in_place=in_place)
    message = str(raised.value)
    assert "owner.path" in message and ("NaN" if bad != bad else "inf") in message
    assert torch.equal(hessian.isnan(), before.isnan())
    assert torch.equal(hessian.nan_to_num(), before.nan_to_num())


def test_a_finite_hessian_whose_sum_overflows_is_not_refused() -> None:
    """The finite check reads the sum first; entries that are each finite but sum past
    float32's range must still factor, not be reported as inf."""
    hessian = 2e34 * (torch.ones(128, 128) + 128 * torch.eye(128))
    assert not bool(torch.isfinite(hessian.sum())) and bool(torch.isfinite(hessian).all())
    upper, dead = inverse_factor(hessian, 0.1, "x")
    assert bool(torch.isfinite(upper).all()) and not bool(dead.any())
    want = torch.linalg.cholesky(torch.linalg.inv(damped(hessian.double(), 0.1)), upper=True)
    torch.testing.assert_close(upper.double(), want, rtol=1e-4, atol=0)


def test_a_weight_of_one_column_keeps_its_largest_entries_as_they_were() -> None:
    weight = torch.tensor([[3.0], [-1.0], [0.5], [-4.0]])
    keep, updated = run(weight, torch.tensor([[2.0]]), 0.5, 128, refit=10)
    assert keep[:, 0].tolist() == [True, False, False, True]
    assert torch.equal(updated, weight * keep)
    # an input that never fired: any two of its weights cost nothing; half go, the rest stay
    keep, updated = run(weight, torch.zeros(1, 1), 0.5, 128, refit=10)
    assert int(keep.sum()) == 2 and torch.equal(updated, weight * keep)


def test_a_weight_of_one_row_is_the_reference() -> None:
    torch.manual_seed(4)
    weight = torch.randn(1, 8, dtype=torch.float64)
    hessian = hessian_of(8)
    keep, updated = run(weight, hessian, 0.5, 8)
    want_keep, want = reference(weight, hessian, 4, 8, 0.1)
    assert torch.equal(keep, want_keep)
    torch.testing.assert_close(updated, want, rtol=1e-10, atol=1e-12)
    keep, _ = run(weight.float(), hessian.float(), 0.5, 8, pattern=NM(2, 4))
    assert keep.reshape(2, 4).sum(dim=1).tolist() == [2, 2]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_are_computed_in_the_hessian_s_dtype_and_returned_in_theirs(
    dtype: torch.dtype,
) -> None:
    torch.manual_seed(5)
    weight = torch.randn(6, 12).to(dtype)
    hessian = hessian_of(12, dead=(4,))
    keep, updated = run(weight, hessian, 0.5, 4)
    want_keep, want = run(weight.double(), hessian, 0.5, 4)
    assert updated.dtype == dtype
    assert torch.equal(keep, want_keep)
    assert torch.equal(updated, want.to(dtype))


@pytest.mark.parametrize("earlier", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prune_model_s_in_place_path_is_the_copying_one_on_its_own_hessian(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, earlier: bool
) -> None:
    """prune_model spends the statistics' Hessian; the copying call on a copy of that very
    Hessian gives the same masks and weights bit for bit, and the model holds them (also
    over masks of an earlier pruning, whose entries stay pruned)."""
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 6)).to(dtype)
    if earlier:
        prune.prune_model(model, 0.25, method="l1")
    first = [layer.weight.eq(0) for layer in (model[0], model[2])]
    batches = [torch.randn(5, 12).to(dtype) for _ in range(3)]
    for batch in batches:
        batch[:, 7] = 0  # an input that never fires
    real = oneshot_execute.sparsegpt_prune_shared
    seen: list[tuple[list[Pair], list[Pair]]] = []

    def spy(weights: Any, hessian: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        assert kwargs.get("spend_hessian") is True
        copy = hessian.clone()
        copied = real([w.clone() for w in weights], copy, *args,
                      **{**kwargs, "spend_hessian": False})  # fmt: skip
        assert torch.equal(copy, hessian)
        got = real(weights, hessian, *args, **kwargs)
        seen.append(([(k.clone(), u.clone()) for k, u in got], copied))  # the caller reuses u
        return got

    monkeypatch.setattr(oneshot_execute, "sparsegpt_prune_shared", spy)
    prune.prune_model(model, 0.5, method="sparsegpt", calibration=batches)
    assert len(seen) == 2
    for (got, copied), layer in zip(seen, (model[0], model[2]), strict=True):
        ((keep, updated),), ((keep2, updated2),) = got, copied
        assert torch.equal(keep, keep2) and torch.equal(updated, updated2)
        assert torch.equal(layer.weight, updated)  # pruned entries are 0 in `updated`
    for layer, zero in zip((model[0], model[2]), first, strict=True):
        assert bool(layer.weight[zero].eq(0).all())
        before = int(zero.sum())  # an amount counts the entries still unpruned, as torch's
        assert int(layer.weight.eq(0).sum()) == before + (layer.weight.numel() - before) // 2
    assert not bool(model[0].weight[:, 7].ne(0).any())  # the dead input's weights pruned first


def _rank_two(x: torch.Tensor) -> torch.Tensor:
    return torch.randn(2, 6)  # two rows: a Hessian of rank 2 over 6 inputs


@pytest.mark.parametrize(
    ("change", "damp", "words"),
    [
        (lambda x: x.index_put_((torch.tensor(0), torch.tensor(2)), torch.tensor(1e20)), 0.1,
         "holds inf entries"),
        (lambda x: x.index_put_((torch.tensor(0), torch.tensor(2)), torch.tensor(float("nan"))),
         0.1, "holds NaN entries"),
        (_rank_two, 0.0, "not positive definite with damp=0.0"),
    ],
)  # fmt: skip
def test_prune_model_names_the_layer_of_a_bad_hessian_and_leaves_the_model(
    change: Any, damp: float, words: str
) -> None:
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = change(torch.randn(5, 6))
    with pytest.raises(ValueError) as raised:
        config = Config(method="sparsegpt", amount=0.5, damp=damp)
        prune.prune_model(model, calibration=[batch], config=config)
    assert "'0.weight'" in str(raised.value) and words in str(raised.value)
    after = model.state_dict()
    assert set(after) == set(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert not prune.is_pruned(model)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64])
def test_a_hessian_of_a_dtype_the_sweep_cannot_use_is_named_not_blamed_on_damp(
    dtype: torch.dtype,
) -> None:
    """A float16 Hessian is positive definite; torch cannot factor it on a CPU. That is no
    reason to ask the caller for a larger damp."""
    hessian = (hessian_of(8) * 10).round().to(dtype)
    with pytest.raises(TypeError) as raised:
        run(torch.randn(4, 8), hessian, 0.5, 8)
    message = str(raised.value)
    assert "SparseGPT" in message and str(dtype).removeprefix("torch.") in message
    assert "float32" in message and "damp" not in message


def test_an_internal_error_of_the_factorization_is_not_rewrapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("internal: kernel missing")

    monkeypatch.setattr(torch.linalg, "cholesky_ex", broken)
    with pytest.raises(RuntimeError, match="internal: kernel missing"):
        inverse_factor(hessian_of(4).float(), 0.1, "x")
