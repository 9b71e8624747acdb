"""Gradual: the pruning hook of a tensor that a GradualPruner prunes, one per tensor.

It is a CustomFromMask whose mask is the tensor's ``<name>_mask`` buffer itself: each
update of the pruner rewrites that buffer in place, so however many updates there are,
the tensor keeps one hook and one mask, and a report names it ``Gradual(L1, 0.62)``:
the criterion (and pattern) and the sparsity the schedule has reached.
"""

from __future__ import annotations

from torch import Tensor, nn

from prunekit.dropin.base_method import BasePruningMethod, PruningContainer
from prunekit.dropin.torch_methods import CustomFromMask

__all__ = ["Gradual", "find_gradual"]


class Gradual(CustomFromMask):
    """Prunes where the mask is 0; the mask is rewritten in place by its GradualPruner.

    A ``GradualPruner`` installs one on each tensor it prunes; a report names it
    ``Gradual(L1, 0.62)`` (`label`, `amount`).

    Args:
        mask: the tensor's mask of 0s and 1s; once installed, the hook holds the module's
            ``<name>_mask`` buffer itself, which the pruner rewrites.
        label: what prunes, as a report shows it (``'L1'``, ``'L2 channels'``).
        amount: the sparsity the mask holds now.

    Attributes:
        label: as given.
        amount: as given; the pruner updates it at each update step.
    """

    PRUNING_TYPE = "global"

    def __init__(self, mask: Tensor, label: str = "", amount: float = 0.0) -> None:
        super().__init__(mask)
        self.label = label
        self.amount = amount

    @property
    def report_name(self) -> str:
        """How a Report's method column names it: ``Gradual(L1, 0.62)``."""
        return f"Gradual({self.label}, {round(self.amount, 4):g})"

    @classmethod
    def apply(  # type: ignore[override]
        cls, module: nn.Module, name: str, mask: Tensor, label: str = "", amount: float = 0.0
    ) -> BasePruningMethod:
        """Prune ``module.<name>`` where `mask` is 0, composing with an earlier pruning."""
        # BasePruningMethod.apply: CustomFromMask.apply takes no label nor amount.
        hook = super(CustomFromMask, cls).apply(module, name, mask=mask, label=label, amount=amount)
        installed = hook[-1] if isinstance(hook, PruningContainer) else hook
        assert isinstance(installed, Gradual)
        owner = module.get_submodule(name.rpartition(".")[0])  # out_proj for 'out_proj.weight'
        buffer = owner._buffers[name.rpartition(".")[2] + "_mask"]
        assert buffer is not None
        installed.mask = buffer  # one mask, not a copy beside it
        return hook

    def __repr__(self) -> str:
        return self.report_name


def find_gradual(module: nn.Module, name: str) -> Gradual | None:
    """The Gradual hook of ``module.<name>`` (alone or in a PruningContainer), or None."""
    for hook in module._forward_pre_hooks.values():
        if not isinstance(hook, BasePruningMethod) or hook._tensor_name != name:
            continue
        methods = list(hook) if isinstance(hook, PruningContainer) else [hook]
        for method in reversed(methods):
            if isinstance(method, Gradual):
                return method
    return None
