"""Criteria for routed experts, from calibration batches: how often the router picks each
expert ('frequency'), and REAP's router-weighted expert activation ('reap').

Both hook the experts modules of the groups (``prunekit.structure.families.experts``): each call
hands them the hidden states, the top-k expert indices and the top-k routing weights. For
'reap', an expert's score is the mean, over the calibration tokens routed to it, of its
routing weight x the L2 norm of its output on that token (computed from its own weights,
as masked); an expert no token reached scores 0. The tokens a batch's ``attention_mask``
(a mapping's, or a tuple's item the model's forward names so) masks out (padding, which the
router routes all the same) are left out; a mask not shaped as its batch's ``input_ids`` is
refused.
Neither changes the model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from prunekit.calibrate import batch_error, evaluating, run_batch
from prunekit.core.errors import value_error
from prunekit.core.example_inputs import token_mask
from prunekit.structure.graph.graph import ChannelGroup, Slice
from prunekit.structure.scoring.protocol import Calibration, GroupCriterion

__all__ = ["ExpertSaliency", "RoutingFrequency"]


class _Tally:
    """Per expert: tokens routed to it, and the sum of routing weight x output norm."""

    def __init__(self, module: nn.Module, count: int, saliency: bool) -> None:
        self.module, self.saliency = module, saliency
        self.routed = torch.zeros(count, dtype=torch.float64)
        self.weighted = torch.zeros(count, dtype=torch.float64)
        self.name = ""  # the module's path in the model, for an error
        self.batch = 0  # the calibration batch running
        self.kept: Tensor | None = None  # its tokens an attention_mask keeps; None: all

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs["hidden_states"]
        index = args[1] if len(args) > 1 else kwargs["top_k_index"]
        weights = args[2] if len(args) > 2 else kwargs["top_k_weights"]
        if self.kept is not None:  # the tokens padding holds are routed too: left out
            tokens = index.shape[0]
            if self.kept.numel() != tokens:
                raise value_error(
                    f"prune_channels: calibration batch {self.batch} has an attention_mask of "
                    f"shape {tuple(self.kept.shape)} ({self.kept.numel()} entries) for "
                    f"{tokens} tokens routed to the experts {self.name or '(the model)'}; "
                    "expected one entry per token (the shape of its input_ids)"
                )
            keep = self.kept.reshape(-1).to(index.device)
            x = x.reshape(tokens, -1)[keep]
            index, weights = index.reshape(tokens, -1)[keep], weights.reshape(tokens, -1)[keep]
        flat = index.reshape(-1).cpu()
        self.routed += torch.bincount(flat, minlength=len(self.routed)).double()
        if not self.saliency:
            return
        x = x.reshape(-1, x.shape[-1])
        for e in torch.unique(flat).tolist():
            token, slot = torch.nonzero(index.reshape(index.shape[0], -1) == e, as_tuple=True)
            out = self._expert(e, x[token])
            gate = weights.reshape(index.shape[0], -1)[token, slot]
            self.weighted[e] += float((gate.double() * out.double().norm(dim=-1)).sum())

    def _expert(self, e: int, x: Tensor) -> Tensor:
        gate_up = getattr(self.module, "gate_up_proj")[e]  # noqa: B009
        down = getattr(self.module, "down_proj")[e]  # noqa: B009
        gate, up = (x @ gate_up.t()).chunk(2, dim=-1)
        act: Any = getattr(self.module, "act_fn")  # noqa: B009  (the experts' activation)
        out: Tensor = (act(gate) * up) @ down.t()
        return out


class _ExpertCriterion(GroupCriterion):
    calibrated = True
    saliency = False
    name = ""

    def __init__(self) -> None:
        self.tallies: dict[int, _Tally] = {}

    def gather(self, calibration: Calibration) -> None:
        model, batches = calibration.model, calibration.required()
        self.tallies = {}
        for g in calibration.groups:
            s = self._experts_slice(g)
            if id(s.module) not in self.tallies:
                count = int(getattr(s.module, s.name).shape[0])
                self.tallies[id(s.module)] = _Tally(s.module, count, self.saliency)
                self.tallies[id(s.module)].name = s.module_name
        handles = [t.module.register_forward_pre_hook(t, with_kwargs=True)
                   for t in self.tallies.values()]  # fmt: skip
        try:
            with torch.no_grad(), evaluating(model):
                for index, batch in enumerate(batches):
                    kept = token_mask(batch, index, "prune_channels", model)
                    for tally in self.tallies.values():
                        tally.batch, tally.kept = index, kept
                    try:
                        run_batch(model, batch)
                    except Exception as error:  # the model's own, named; prunekit's as they are
                        raise batch_error(index, error, owner="prune_channels")  # noqa: B904
        finally:
            for handle in handles:
                handle.remove()

    def _experts_slice(self, group: ChannelGroup) -> Slice:
        for s in group.slices:
            if s.name == "gate_up_proj" and s.dim == 0 and s.role == "out":
                return s
        raise ValueError(
            f"prune_channels: criterion {self.name!r} ranks routed experts only, but group "
            f"{group.name} is of kind {group.kind!r}; expected a call that prunes experts "
            f"alone (experts=..., amount=heads=hidden=0.0), or another criterion"
        )

    def scores(self, group: ChannelGroup) -> Tensor:
        s = self._experts_slice(group)
        tally = self.tallies.get(id(s.module))
        if tally is None:
            raise ValueError(f"prune_channels: criterion {self.name!r} was not prepared")
        per = self._per_expert(tally)
        return torch.stack([per[list(positions)].sum() for positions in s.indices])

    def _per_expert(self, tally: _Tally) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return repr(self.name)


class RoutingFrequency(_ExpertCriterion):
    """'frequency': the share of the calibration tokens' top-k choices that went to each
    expert (an expert the router never picks goes first)."""

    name = "frequency"

    def _per_expert(self, tally: _Tally) -> Tensor:
        total = float(tally.routed.sum())
        return tally.routed / total if total else tally.routed


class ExpertSaliency(_ExpertCriterion):
    """'reap': per expert, the mean over the calibration tokens routed to it of routing
    weight x ||expert output|| (router-weighted expert activation pruning)."""

    name = "reap"
    saliency = True

    def _per_expert(self, tally: _Tally) -> Tensor:
        return tally.weighted / tally.routed.clamp_min(1.0)
