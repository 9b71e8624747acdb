"""core: the reparameterization, composition, rollback and remove, on both frameworks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

import prunekit as prune
from helpers.frameworks import Framework
from prunekit.dropin.base_method import combine_masks


class Threshold(prune.BasePruningMethod):
    """Prunes entries whose |score| is below a threshold (a user-defined method)."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return default_mask * (t.abs() >= self.threshold).to(default_mask.dtype)


def test_apply_moves_the_same_parameter_to_orig(framework: Framework) -> None:
    m = framework.nn.Linear(4, 3)
    weight = m.weight
    method = prune.L1Unstructured.apply(m, "weight", amount=5)
    assert m.weight_orig is weight
    assert "weight" not in m._parameters
    assert list(m._parameters) == ["bias", "weight_orig"]
    assert isinstance(m.weight_mask, framework.ns.Tensor)
    assert "weight_mask" in m._buffers
    assert framework.equal(m.weight, m.weight_mask * m.weight_orig)
    assert int((m.weight_mask == 0).sum()) == 5
    assert method._tensor_name == "weight"
    assert list(m._forward_pre_hooks.values()) == [method]


def test_state_dict_holds_orig_and_mask(framework: Framework) -> None:
    m = framework.nn.Linear(4, 3)
    prune.l1_unstructured(m, "weight", 0.5)
    assert list(m.state_dict()) == ["bias", "weight_orig", "weight_mask"]


def test_hook_refreshes_the_masked_tensor_on_forward(framework: Framework) -> None:
    m = framework.nn.Linear(4, 3)
    prune.random_unstructured(m, "weight", 0.5)
    with framework.ns.no_grad():
        m.weight_orig.add_(1.0)
    m(framework.ns.randn(2, 4))
    assert framework.equal(m.weight, m.weight_mask * m.weight_orig)


def test_gradients_reach_orig_only_through_unpruned_entries(framework: Framework) -> None:
    m = framework.nn.Linear(6, 5)
    prune.l1_unstructured(m, "weight", 0.4)
    m(framework.ns.randn(8, 6)).sum().backward()
    grad = m.weight_orig.grad
    assert grad is not None
    assert framework.ns.all(grad[m.weight_mask == 0] == 0)
    assert framework.ns.all(grad[m.weight_mask == 1] != 0)


def test_mask_dtype_follows_the_parameter(framework: Framework) -> None:
    m = framework.nn.Linear(4, 4).double()
    scores = framework.ns.randn(4, 4, dtype=framework.ns.float32)
    prune.ln_structured(m, "weight", 1, n=2, dim=0, importance_scores=scores)
    assert m.weight_mask.dtype == framework.ns.float64
    prune.custom_from_mask(m, "weight", framework.ns.ones(4, 4, dtype=framework.ns.bool))
    assert m.weight_mask.dtype == framework.ns.float64


def test_importance_scores_rank_instead_of_the_weights(framework: Framework) -> None:
    m = framework.nn.Linear(5, 2)
    scores = framework.ns.arange(10, dtype=framework.ns.float32).reshape(2, 5)
    prune.l1_unstructured(m, "weight", 3, importance_scores=scores)
    assert m.weight_mask.reshape(-1).tolist() == [0.0] * 3 + [1.0] * 7


def test_importance_scores_of_wrong_shape_are_rejected(framework: Framework) -> None:
    m = framework.nn.Linear(5, 2)
    with pytest.raises(ValueError, match=r"importance_scores have shape \(5, 2\); expected"):
        prune.l1_unstructured(m, "weight", 3, importance_scores=framework.ns.ones(5, 2))
    assert not prune.is_pruned(m)
    assert "weight" in m._parameters


def test_second_pruning_composes_in_one_container(framework: Framework) -> None:
    m = framework.nn.Linear(10, 10)
    first = prune.L1Unstructured.apply(m, "weight", amount=0.5)
    container = prune.RandomUnstructured.apply(m, "weight", amount=0.5)
    assert isinstance(container, prune.PruningContainer)
    assert container._pruning_methods[0] is first
    assert isinstance(container._pruning_methods, tuple)
    assert list(m._forward_pre_hooks.values()) == [container]
    # 50 pruned, then half of the 50 left: 75 in all
    assert int((m.weight_mask == 0).sum()) == 75
    third = prune.LnStructured.apply(m, "weight", amount=1, n=1, dim=0)
    assert third is container
    assert len(container) == 3
    assert [type(x) for x in container] == [
        prune.L1Unstructured,
        prune.RandomUnstructured,
        prune.LnStructured,
    ]


def test_unstructured_ranks_only_unpruned_entries(framework: Framework) -> None:
    m = framework.nn.Linear(4, 1, bias=False)
    with framework.ns.no_grad():
        m.weight.copy_(framework.tensor([[0.1, 0.2, 0.3, 0.4]]))
    prune.l1_unstructured(m, "weight", 1)
    prune.l1_unstructured(m, "weight", 1)
    assert m.weight_mask.tolist() == [[0.0, 0.0, 1.0, 1.0]]
    prune.l1_unstructured(m, "weight", 0.5)  # half of the two left
    assert m.weight_mask.tolist() == [[0.0, 0.0, 0.0, 1.0]]


def test_structured_ranks_only_live_channels(framework: Framework) -> None:
    m = framework.nn.Linear(3, 4, bias=False)
    with framework.ns.no_grad():
        m.weight.copy_(framework.tensor([[1.0] * 3, [2.0] * 3, [3.0] * 3, [4.0] * 3]))
    prune.ln_structured(m, "weight", 1, n=2, dim=0)
    prune.ln_structured(m, "weight", 0.5, n=2, dim=0)  # half of the 3 live rows: 2
    assert m.weight_mask[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0]


def test_global_type_sees_every_entry(framework: Framework) -> None:
    m = framework.nn.Linear(2, 1, bias=False)
    prune.custom_from_mask(m, "weight", framework.tensor([[0.0, 1.0]]))
    prune.custom_from_mask(m, "weight", framework.tensor([[1.0, 0.0]]))
    assert m.weight_mask.tolist() == [[0.0, 0.0]]


def test_count_above_available_units_is_an_error_at_apply(framework: Framework) -> None:
    m = framework.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"parameter 'weight' of Linear: .*amount=7"):
        prune.l1_unstructured(m, "weight", 7)
    prune.l1_unstructured(m, "weight", 4)
    with pytest.raises(ValueError, match="amount=3 is more than the 2 units"):
        prune.l1_unstructured(m, "weight", 3)


def test_bad_amount_is_an_error_at_construction(framework: Framework) -> None:
    with pytest.raises(ValueError, match=r"amount=1\.5"):
        prune.L1Unstructured(1.5)
    with pytest.raises(TypeError, match="amount='half'"):
        prune.RandomUnstructured("half")  # type: ignore[arg-type]
    m = framework.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="parameter 'weight' of Linear: L1Unstructured"):
        prune.l1_unstructured(m, "weight", -1)


def test_failed_composition_keeps_the_old_pruning(framework: Framework) -> None:
    m = framework.nn.Linear(3, 2)
    method = prune.L1Unstructured.apply(m, "weight", 2)
    mask = m.weight_mask.clone()
    with pytest.raises(ValueError):
        prune.l1_unstructured(m, "weight", 5)
    assert list(m._forward_pre_hooks.values()) == [method]
    assert framework.equal(m.weight_mask, mask)
    assert not isinstance(method, prune.PruningContainer)


def test_remove_makes_pruning_permanent(framework: Framework) -> None:
    m = framework.nn.Linear(5, 4)
    weight = m.weight
    prune.l1_unstructured(m, "weight", 0.5)
    expected = (m.weight_mask * m.weight_orig).detach().clone()
    prune.remove(m, "weight")
    assert m.weight is weight
    assert isinstance(m.weight, framework.nn.Parameter)
    assert framework.equal(m.weight.detach(), expected)
    assert list(m.state_dict()) == ["bias", "weight"]
    assert not hasattr(m, "weight_orig")
    assert not hasattr(m, "weight_mask")
    assert not prune.is_pruned(m)


def test_remove_of_unpruned_tensor_is_a_value_error(framework: Framework) -> None:
    m = framework.nn.Linear(5, 4)
    with pytest.raises(ValueError, match="parameter 'weight' of Linear is not pruned"):
        prune.remove(m, "weight")


def test_method_remove_without_apply(framework: Framework) -> None:
    with pytest.raises(RuntimeError, match="not attached"):
        prune.L1Unstructured(1).remove(framework.nn.Linear(2, 2))


def test_prune_returns_a_pruned_copy(framework: Framework) -> None:
    t = framework.tensor([3.0, -1.0, 2.0, 0.5])
    out = prune.L1Unstructured(2).prune(t)
    assert out.tolist() == [3.0, 0.0, 2.0, 0.0]
    assert t.tolist() == [3.0, -1.0, 2.0, 0.5]
    scores = framework.tensor([0.0, 1.0, 2.0, 3.0])
    assert prune.L1Unstructured(1).prune(t, importance_scores=scores).tolist() == [
        0.0,
        -1.0,
        2.0,
        0.5,
    ]
    default = framework.tensor([1.0, 1.0, 1.0, 0.0])
    assert prune.Identity().prune(t, default_mask=default).tolist() == [3.0, -1.0, 2.0, 0.0]


def test_apply_mask_multiplies_mask_and_orig(framework: Framework) -> None:
    m = framework.nn.Linear(3, 3)
    method = prune.L1Unstructured.apply(m, "weight", 4)
    assert framework.equal(method.apply_mask(m), m.weight_mask * m.weight_orig)


def test_pruning_base_is_an_alias() -> None:
    assert prune.PruningBase is prune.BasePruningMethod


class _KeepAll:
    """compute_mask of the classes below: keeps every entry."""

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return default_mask


def _typeless(library: Any) -> type:
    return type("NoType", (_KeepAll, library.BasePruningMethod), {})


def _mistyped(library: Any) -> type:
    return type("BadType", (_KeepAll, library.BasePruningMethod), {"PRUNING_TYPE": "channels"})


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (_typeless, AttributeError, "NoType declares no PRUNING_TYPE"),
        (_mistyped, ValueError, "PRUNING_TYPE='channels' is not allowed"),
    ],
    ids=["missing", "unknown"],
)
def test_pruning_type_is_checked_at_composition_as_in_torch(
    make: Callable[[Any], type], error: type[Exception], message: str
) -> None:
    # torch accepts such a class until a second pruning composes it; so does prunekit,
    # with the same exception type and a message that says what is allowed.
    for library in (torch_prune, prune):
        cls = make(library)  # defining the class raises nothing
        m = nn.Linear(4, 3)
        cls.apply(m, "weight")  # a first pruning needs no PRUNING_TYPE
        library.l1_unstructured(m, "weight", amount=2)
        before = {k: v.clone() for k, v in m.state_dict().items()}
        with pytest.raises(error) as caught:
            cls.apply(m, "weight")  # composing with it reads its PRUNING_TYPE
        if library is prune:
            assert message in str(caught.value)
            assert "PRUNING_TYPE" in str(caught.value) and "expected" in str(caught.value)
            after = m.state_dict()
            assert list(after) == list(before)
            assert all(v.equal(before[k]) for k, v in after.items())


def test_composition_moves_the_hook_after_other_hooks_as_in_torch() -> None:
    # torch registers the composed hook anew: it runs after the hooks registered since the
    # first pruning (a hook that edits weight_orig before the mask is applied, say).
    orders = []
    for library in (torch_prune, prune):
        m = nn.Linear(4, 3)
        m.register_forward_pre_hook(lambda module, args: None)
        library.l1_unstructured(m, "weight", amount=2)
        m.register_forward_pre_hook(lambda module, args: None)
        library.l1_unstructured(m, "weight", amount=2)
        orders.append([type(h).__name__ for h in m._forward_pre_hooks.values()])
    assert orders[1] == orders[0] == ["function", "function", "PruningContainer"]


def test_global_pruning_reads_pruning_type_from_the_instance() -> None:
    m = nn.Linear(4, 3)
    with pytest.raises(AttributeError, match="declares no PRUNING_TYPE"):
        prune.global_unstructured([(m, "weight")], _typeless(prune))
    with pytest.raises(TypeError, match="has PRUNING_TYPE 'channels'"):
        prune.global_unstructured([(m, "weight")], _mistyped(prune))
    assert not prune.is_pruned(m)


def test_abstract_intermediate_class_needs_no_type() -> None:
    class Intermediate(prune.BasePruningMethod):
        pass

    with pytest.raises(TypeError):
        Intermediate()  # type: ignore[abstract]


def test_user_defined_method_applies_composes_and_removes(framework: Framework) -> None:
    m = framework.nn.Linear(4, 2, bias=False)
    with framework.ns.no_grad():
        m.weight.copy_(framework.tensor([[0.1, -0.5, 2.0, 0.3], [-3.0, 0.05, 0.6, -0.2]]))
    Threshold.apply(m, "weight", threshold=0.25)
    assert m.weight_mask.tolist() == [[0.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0]]
    prune.l1_unstructured(m, "weight", 2)  # smallest of the live: 0.3 and -0.5
    assert m.weight_mask.tolist() == [[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]]
    Threshold.apply(m, "weight", threshold=1.0)
    assert m.weight_mask.tolist() == [[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    prune.remove(m, "weight")
    assert m.weight.tolist() == [[0.0, 0.0, 2.0, 0.0], [-3.0, 0.0, 0.0, 0.0]]


class Doubled(prune.BasePruningMethod):
    """Prunes the first entry and computes its values its own way: twice mask * orig."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        mask = default_mask.clone()
        mask.view(-1)[0] = 0
        return mask

    def apply_mask(self, module: nn.Module) -> Tensor:
        return super().apply_mask(module) * 2


def test_remove_keeps_the_values_of_an_own_apply_mask(framework: Framework) -> None:
    # torch's remove() writes apply_mask()'s result: the tensor the forward used.
    m = framework.nn.Linear(3, 2)
    Doubled.apply(m, "weight")
    expected = m.weight.detach().clone()
    prune.remove(m, "weight")
    assert framework.equal(m.weight.detach(), expected)


def test_container_rejects_other_tensors_and_non_methods() -> None:
    a = prune.L1Unstructured(1)
    a._tensor_name = "weight"
    b = prune.L1Unstructured(1)
    b._tensor_name = "bias"
    container = prune.PruningContainer(a)
    assert container._tensor_name == "weight"
    with pytest.raises(ValueError, match="cannot add one for 'bias'"):
        container.add_pruning_method(b)
    with pytest.raises(TypeError, match="invalid method of type int; expected"):
        container.add_pruning_method(3)  # type: ignore[arg-type]
    assert len(container) == 1


def test_container_from_several_methods() -> None:
    a, b = prune.L1Unstructured(1), prune.Identity()
    a._tensor_name = b._tensor_name = "weight"
    container = prune.PruningContainer(a, b)
    assert container[0] is a and container[1] is b


def test_empty_container_cannot_compute(framework: Framework) -> None:
    with pytest.raises(ValueError, match="empty"):
        prune.PruningContainer().compute_mask(framework.ns.ones(2), framework.ns.ones(2))


def test_combine_masks_needs_dim_for_structured(framework: Framework) -> None:
    class NoDim(prune.BasePruningMethod):
        PRUNING_TYPE = "structured"

        def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
            return default_mask

    with pytest.raises(AttributeError, match="no attribute 'dim'"):
        combine_masks(NoDim(), framework.ns.ones(2, 2), framework.ns.ones(2, 2))


def test_combine_masks_leaves_its_input_alone(framework: Framework) -> None:
    mask = framework.tensor([1.0, 0.0, 1.0, 1.0])
    out = combine_masks(prune.L1Unstructured(1), framework.tensor([4.0, 3.0, 2.0, 1.0]), mask)
    assert out.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert mask.tolist() == [1.0, 0.0, 1.0, 1.0]


def test_two_tensors_of_one_module_have_their_own_hooks(framework: Framework) -> None:
    m = framework.nn.Linear(4, 4)
    prune.l1_unstructured(m, "weight", 3)
    prune.l1_unstructured(m, "bias", 1)
    names = sorted(h._tensor_name for h in m._forward_pre_hooks.values())
    assert names == ["bias", "weight"]
    prune.remove(m, "bias")
    assert [h._tensor_name for h in m._forward_pre_hooks.values()] == ["weight"]


def test_second_pruning_ranks_current_values_even_without_a_forward(framework: Framework) -> None:
    m = framework.nn.Linear(4, 1, bias=False)
    with framework.ns.no_grad():
        m.weight.copy_(framework.tensor([[1.0, 2.0, 3.0, 4.0]]))
    prune.l1_unstructured(m, "weight", 1)
    with framework.ns.no_grad():  # an optimizer step, no forward since
        m.weight_orig.copy_(framework.tensor([[1.0, 9.0, 0.5, 8.0]]))
    prune.l1_unstructured(m, "weight", 1)
    assert m.weight_mask.tolist() == [[0.0, 1.0, 0.0, 1.0]]
    assert m.weight.tolist() == [[0.0, 9.0, 0.0, 8.0]]


def test_structured_method_with_a_bad_dim_is_named_in_the_error(framework: Framework) -> None:
    class Rows(prune.BasePruningMethod):
        PRUNING_TYPE = "structured"

        def __init__(self, dim: int) -> None:
            self.dim = dim

        def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
            return default_mask

    m = framework.nn.Linear(3, 2)
    method = prune.Identity.apply(m, "weight")
    with pytest.raises(
        IndexError,
        match=r"parameter 'weight' of Linear: Rows: dim=5 is out of range .*expected an int in "
        r"\[-2, 1\]",
    ):
        Rows.apply(m, "weight", dim=5)
    assert list(m._forward_pre_hooks.values()) == [method]
