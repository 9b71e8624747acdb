"""Random sequences of pruning, training, copying, reloading and removing, checked at every step.

A twin model pruned with torch.nn.utils.prune follows the same operations; masks and outputs
must match wherever torch's choice is deterministic (no ties among the ranked scores).
Random methods, and rankings with ties, are passed on to the twin as custom masks.
"""

from __future__ import annotations

import copy
import math
import pickle
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from torch import Tensor, nn

import prunekit as prune
from helpers.model_state import fingerprint

TARGETS = [("0", "weight"), ("0", "bias"), ("2", "weight")]
MATRICES = [t for t in TARGETS if t[1] == "weight"]
AMOUNTS = st.one_of(st.sampled_from([0.0, 0.2, 0.5, 1.0]), st.integers(0, 4))


def build(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))


def mask_of(model: nn.Module, target: tuple[str, str]) -> Tensor | None:
    module = model.get_submodule(target[0])
    mask = getattr(module, target[1] + "_mask", None)
    return None if mask is None else mask.detach().clone()


def current(model: nn.Module, target: tuple[str, str]) -> Tensor:
    module = model.get_submodule(target[0])
    orig = getattr(module, target[1] + "_orig", None)
    if orig is None:
        return getattr(module, target[1]).detach().clone()
    return (orig * getattr(module, target[1] + "_mask")).detach()


def has_ties(values: Tensor) -> bool:
    return values.unique().numel() < values.numel()


def expected_count(amount: float, units: int) -> int:
    return amount if isinstance(amount, int) else round(amount * units)


class PruningMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ours = build(0)
        self.theirs = build(0)
        self.x = torch.randn(6, 5)

    # -- helpers -------------------------------------------------------------------

    def module(self, target: tuple[str, str], model: nn.Module | None = None) -> nn.Module:
        return (model or self.ours).get_submodule(target[0])

    def ones(self, target: tuple[str, str]) -> Tensor:
        mask = mask_of(self.ours, target)
        return torch.ones_like(current(self.ours, target)) if mask is None else mask

    def sync(self, target: tuple[str, str]) -> None:
        """Give the twin our new mask (for random choices and ties)."""
        mask = mask_of(self.ours, target)
        assert mask is not None
        torch_prune.custom_from_mask(self.module(target, self.theirs), target[1], mask)

    def expect_failure(self, call: Any) -> None:
        before = fingerprint(self.ours)
        with pytest.raises((ValueError, IndexError)):
            call()
        assert fingerprint(self.ours) == before

    # -- pruning -------------------------------------------------------------------

    @rule(target_=st.sampled_from(TARGETS), amount=AMOUNTS)
    def l1(self, target_: tuple[str, str], amount: float) -> None:
        alive = self.ones(target_)
        units = int(alive.sum())
        if isinstance(amount, int) and amount > units:
            self.expect_failure(
                lambda: prune.l1_unstructured(self.module(target_), target_[1], amount)
            )
            return
        ranked = current(self.ours, target_)[alive == 1].abs()
        prune.l1_unstructured(self.module(target_), target_[1], amount)
        after = mask_of(self.ours, target_)
        assert after is not None
        assert int((alive - after).sum()) == expected_count(amount, units)
        if has_ties(ranked):
            self.sync(target_)
        else:
            torch_prune.l1_unstructured(self.module(target_, self.theirs), target_[1], amount)

    @rule(target_=st.sampled_from(TARGETS), amount=AMOUNTS)
    def random(self, target_: tuple[str, str], amount: float) -> None:
        alive = self.ones(target_)
        units = int(alive.sum())
        if isinstance(amount, int) and amount > units:
            self.expect_failure(
                lambda: prune.random_unstructured(self.module(target_), target_[1], amount)
            )
            return
        prune.random_unstructured(self.module(target_), target_[1], amount)
        after = mask_of(self.ours, target_)
        assert after is not None
        assert int((alive - after).sum()) == expected_count(amount, units)
        self.sync(target_)

    @rule(
        target_=st.sampled_from(MATRICES),
        amount=AMOUNTS,
        n=st.sampled_from([1, 2, math.inf]),
        dim=st.sampled_from([0, 1, -1]),
    )
    def ln(self, target_: tuple[str, str], amount: float, n: float, dim: int) -> None:
        alive = self.ones(target_)
        others = 1 - (dim % 2)
        channels = alive.sum(dim=others) != 0
        units = int(channels.sum())
        if isinstance(amount, int) and amount > units:
            call = lambda: prune.ln_structured(self.module(target_), target_[1], amount, n, dim)  # noqa: E731
            self.expect_failure(call)
            return
        norms = current(self.ours, target_).norm(p=n, dim=others)[channels]
        prune.ln_structured(self.module(target_), target_[1], amount, n=n, dim=dim)
        after = mask_of(self.ours, target_)
        assert after is not None
        dead = int(channels.sum()) - int((after.sum(dim=others) != 0).sum())
        assert dead == expected_count(amount, units)
        if has_ties(norms):
            self.sync(target_)
        else:
            torch_prune.ln_structured(
                self.module(target_, self.theirs), target_[1], amount, n=n, dim=dim
            )

    @rule(target_=st.sampled_from(MATRICES), amount=AMOUNTS, dim=st.sampled_from([0, 1]))
    def random_structured(self, target_: tuple[str, str], amount: float, dim: int) -> None:
        alive = self.ones(target_)
        channels = alive.sum(dim=1 - dim) != 0
        units = int(channels.sum())
        if isinstance(amount, int) and amount > units:
            call = lambda: prune.random_structured(self.module(target_), target_[1], amount, dim)  # noqa: E731
            self.expect_failure(call)
            return
        prune.random_structured(self.module(target_), target_[1], amount, dim=dim)
        after = mask_of(self.ours, target_)
        assert after is not None
        assert units - int((after.sum(dim=1 - dim) != 0).sum()) == expected_count(amount, units)
        self.sync(target_)

    @rule(target_=st.sampled_from(TARGETS))
    def identity(self, target_: tuple[str, str]) -> None:
        prune.identity(self.module(target_), target_[1])
        torch_prune.identity(self.module(target_, self.theirs), target_[1])

    @rule(target_=st.sampled_from(TARGETS), data=st.data())
    def custom(self, target_: tuple[str, str], data: st.DataObject) -> None:
        shape = tuple(current(self.ours, target_).shape)
        flags = data.draw(
            st.lists(st.booleans(), min_size=math.prod(shape), max_size=math.prod(shape))
        )
        mask = torch.tensor(flags, dtype=torch.float32).reshape(shape)
        before = self.ones(target_)
        prune.custom_from_mask(self.module(target_), target_[1], mask)
        torch_prune.custom_from_mask(self.module(target_, self.theirs), target_[1], mask)
        assert torch.equal(mask_of(self.ours, target_), before * mask)

    @rule(amount=st.sampled_from([0.1, 0.3, 0.6, 2, 5]))
    def global_l1(self, amount: float) -> None:
        ranked = torch.cat([current(self.ours, t)[self.ones(t) == 1].abs() for t in TARGETS])
        params = [(self.module(t), t[1]) for t in TARGETS]
        if isinstance(amount, int) and amount > ranked.numel():
            self.expect_failure(
                lambda: prune.global_unstructured(params, prune.L1Unstructured, amount=amount)
            )
            return
        prune.global_unstructured(params, prune.L1Unstructured, amount=amount)
        if has_ties(ranked):
            for t in TARGETS:
                self.sync(t)
        else:
            torch_prune.global_unstructured(
                [(self.module(t, self.theirs), t[1]) for t in TARGETS],
                torch_prune.L1Unstructured,
                amount=amount,
            )

    @rule(target_=st.sampled_from(TARGETS))
    def remove(self, target_: tuple[str, str]) -> None:
        if mask_of(self.ours, target_) is None:
            self.expect_failure(lambda: prune.remove(self.module(target_), target_[1]))
            return
        param = self.module(target_)._parameters[target_[1] + "_orig"]
        prune.remove(self.module(target_), target_[1])
        assert self.module(target_)._parameters[target_[1]] is param
        torch_prune.remove(self.module(target_, self.theirs), target_[1])

    # -- using and moving the model ------------------------------------------------

    @rule()
    def forward(self) -> None:
        with torch.no_grad():
            assert torch.equal(self.ours(self.x), self.theirs(self.x))

    @rule(lr=st.sampled_from([0.01, 0.5]))
    def train_step(self, lr: float) -> None:
        for model in (self.ours, self.theirs):
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            optimizer.zero_grad()
            model(self.x).square().sum().backward()
            optimizer.step()
        for t in TARGETS:
            mask = mask_of(self.ours, t)
            if mask is not None:
                grad = self.module(t)._parameters[t[1] + "_orig"].grad
                assert grad is not None
                assert not grad[mask == 0].any()

    @rule()
    def deepcopy(self) -> None:
        self.ours(self.x).sum().backward()  # non-leaf pruned tensors: pytorch#37322
        before = fingerprint(self.ours)
        copied = copy.deepcopy(self.ours)
        assert fingerprint(self.ours) == before
        self.ours = copied

    @rule()
    def pickle_round_trip(self) -> None:
        self.ours(self.x).sum().backward()
        self.ours = pickle.loads(pickle.dumps(self.ours))

    @rule(seed=st.integers(1, 3))
    def state_dict_round_trip(self, seed: int) -> None:
        fresh = build(seed)
        prune.load_pruned_state_dict(fresh, self.ours.state_dict())
        self.ours = fresh

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def masks_match_torch_and_tensors_are_consistent(self) -> None:
        # torch ranks module.<name> as left by the last forward (stale after an optimizer
        # step); a forward on both keeps the comparison to where torch is correct.
        with torch.no_grad():
            assert torch.equal(self.ours(self.x), self.theirs(self.x))
        ours_state, theirs_state = self.ours.state_dict(), self.theirs.state_dict()
        assert set(ours_state) == set(theirs_state)
        for key, value in ours_state.items():
            assert torch.equal(value, theirs_state[key]), key
        for t in TARGETS:
            module = self.module(t)
            mask = mask_of(self.ours, t)
            hooks = [
                h
                for h in module._forward_pre_hooks.values()
                if isinstance(h, prune.BasePruningMethod) and h._tensor_name == t[1]
            ]
            if mask is None:
                assert hooks == []
                assert isinstance(module._parameters[t[1]], nn.Parameter)
                continue
            assert len(hooks) == 1
            assert t[1] not in module._parameters
            orig = module._parameters[t[1] + "_orig"]
            assert isinstance(orig, nn.Parameter)
            assert mask.dtype == orig.dtype
            assert bool(((mask == 0) | (mask == 1)).all())
            assert torch.equal(getattr(module, t[1]), orig * mask)


PruningMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_pruning_machine = PruningMachine.TestCase
