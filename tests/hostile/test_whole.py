"""Hostile calls of prunekit.prune_model (prunekit.whole): arguments the method would read
and ignore, globs that leave out one name of a module shared under several paths; each
refusal names the argument or the names and leaves the model exactly as it was."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hostile.support import refused
from prunekit.whole import Config, prune_model


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(),
                         nn.Linear(8, 4))  # fmt: skip


def _loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    return output.pow(2).sum()


# --- a loss beside a method that ranks without data --------------------------------------------


@pytest.mark.parametrize("given", ["keywords", "config"])
@pytest.mark.parametrize("method", ["l1", "random", "ln"])
def test_a_loss_beside_a_method_without_data_is_refused(method: str, given: str) -> None:
    """`loss` ranks the entries of 'taylor'; with l1, random or ln (pattern unstructured)
    it was read and silently ignored, where the same call with pattern='row' refused it."""
    model = _net()
    if given == "keywords":
        call = lambda: prune_model(model, 0.5, method=method, loss=_loss)  # noqa: E731
    else:
        config = Config(method=method, amount=0.5)
        call = lambda: prune_model(model, config=config, loss=_loss)  # noqa: E731
    refused(call, ValueError,
            rf"prune_model: method='{method}' uses no calibration data; expected "
            r"calibration=None and loss=None \(calibrated methods: wanda, sparsegpt, taylor\)",
            model=model)  # fmt: skip


def test_a_pattern_beside_ln_is_still_named_as_such() -> None:
    model = _net()
    refused(lambda: prune_model(model, 0.5, method="ln", pattern="row"), ValueError,
            r"prune_model: method='ln' takes no pattern; expected pattern='unstructured'",
            model=model)  # fmt: skip


# --- a module shared under several paths -------------------------------------------------------


def _shared() -> tuple[nn.Sequential, nn.Linear]:
    torch.manual_seed(0)
    layer = nn.Linear(8, 8)
    return nn.Sequential(layer, nn.ReLU(), layer, nn.ReLU(), nn.Linear(8, 2)), layer


@pytest.mark.parametrize("exclude", ["2", "2.weight", "0.weight", "0"])
@pytest.mark.parametrize("method", ["l1", "random"])
def test_a_shared_module_left_out_under_one_of_its_names_is_refused(
    method: str, exclude: str
) -> None:
    """One module at '0' and '2': exclude='2' (or '0.weight') left it out under that name
    and pruned it under the other, silently (its weight masked, both uses with it)."""
    model, _ = _shared()
    refused(lambda: prune_model(model, 0.5, method=method, exclude=exclude), ValueError,
            r"prune_model: '0.weight', '2.weight' are one Parameter .*select only "
            r"\['(0|2).weight'\]; expected globs that select all of its names or none",
            model=model)  # fmt: skip


@pytest.mark.parametrize("exclude", [["0", "2"], ["0.weight", "2.weight"], ["*.weight"]])
def test_a_shared_module_left_out_under_all_its_names_is_left_dense(exclude: list[str]) -> None:
    model, layer = _shared()
    if exclude == ["*.weight"]:
        refused(lambda: prune_model(model, 0.5, exclude=exclude), ValueError,
                "no tensor left to prune", model=model)  # fmt: skip
        return
    found = prune_model(model, 0.5, exclude=exclude)
    assert not hasattr(layer, "weight_mask")
    assert found["4.weight"].sparsity == 0.5


def test_a_shared_module_included_under_one_name_is_pruned_once() -> None:
    """What the refusal above must leave: include by either name selects it (one module)."""
    model, layer = _shared()
    found = prune_model(model, 0.5, include="2")
    assert found["0.weight"].sparsity == 0.5 and not hasattr(model[4], "weight_mask")
    assert len(layer._forward_pre_hooks) == 1


# --- the unstructured pattern given as a Pattern ------------------------------------------------


@pytest.mark.parametrize("method", ["l1", "random", "ln"])
def test_the_unstructured_pattern_as_an_object_prunes_as_its_name(method: str) -> None:
    """pattern=Unstructured() is pattern='unstructured': 'ln' (which takes no other) refused
    it ("takes no pattern; expected pattern='unstructured'"), prune_state_dict too ("a
    state_dict is pruned with pattern='unstructured'")."""
    from prunekit.io.statedict import prune_state_dict
    from prunekit.patterns import Unstructured

    named, given = _net(), _net()
    prune_model(named, 0.5, method=method, pattern="unstructured")
    prune_model(given, 0.5, method=method, pattern=Unstructured())
    assert [n for n, _ in named.named_buffers()] == [n for n, _ in given.named_buffers()]
    if method != "random":  # drawn: masks of their own
        assert all(torch.equal(a, b) for a, b in zip(named.buffers(), given.buffers(),
                                                     strict=True))  # fmt: skip
    state = _net().state_dict()
    config = Config(method=method, amount=0.5, pattern=Unstructured())
    found = prune_state_dict(state, config=config, seed=0 if method == "random" else None)
    plain = prune_state_dict(state, config=Config(method=method, amount=0.5),
                             seed=0 if method == "random" else None)  # fmt: skip
    assert all(torch.equal(found.state[k], plain.state[k]) for k in plain.state)


# --- the old name of scope beside the new one ---------------------------------------------------


@pytest.mark.parametrize(("scope", "old"), [("layer", True), ("global", False)])
def test_scope_and_its_old_name_that_disagree_are_refused(scope: str, old: bool) -> None:
    """scope='layer' given with global_pruning=True pruned globally (a FutureWarning
    alone): a scope given as its default was taken for none given; the other way round
    was refused."""
    import warnings

    from prunekit.io.statedict import prune_state_dict

    state = _net().state_dict()
    before = {k: v.clone() for k, v in state.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match=rf"prune_state_dict: scope='{scope}' and "
                           rf"global_pruning={old} disagree; expected scope= alone"):  # fmt: skip
            prune_state_dict(state, 0.5, scope=scope, global_pruning=old)
    assert all(torch.equal(state[k], before[k]) for k in before)


# --- a Config made without ranks, given with a process group -----------------------------------


@pytest.mark.parametrize("over", [True, False], ids=["over-ranks", "alone"])
def test_a_config_prunes_as_its_keywords_over_ranks_and_alone(over: bool) -> None:
    """Config(method='sparsegpt') defaulted sequential to 'layers' for a run alone; given
    with a process_group it kept it, refused there ("expected sequential=True with
    process_group") where the same keywords prune. Made with ranks=True (True) and run
    alone, it calibrated block by block where the keywords take 'layers', silently."""
    from helpers import distributed_calibration as calibrated
    from helpers.thread_group import on_threads

    batches = calibrated.batches(0, 1)  # one of odd size: the experts run

    def run(group: Any, config: Config | None) -> dict[str, torch.Tensor]:
        model = calibrated.build()
        given: dict[str, Any] = {"process_group": group} if group is not None else {}
        if config is None:
            prune_model(model, 0.5, method="sparsegpt", calibration=batches, **given)
        else:
            prune_model(model, config=config, calibration=batches, **given)
        return {k: v.clone() for k, v in model.state_dict().items()}

    config = Config(method="sparsegpt", amount=0.5, ranks=not over)
    if over:
        found = on_threads(2, lambda g: run(g, config))
        want = on_threads(2, lambda g: run(g, None))
    else:
        found, want = [run(None, config)], [run(None, None)]
    for mine, told in zip(found, want, strict=True):
        assert mine.keys() == told.keys()
        assert all(torch.equal(mine[k], told[k]) for k in told)


def test_a_sequential_given_in_a_config_is_kept_over_ranks() -> None:
    """What the fix above must leave: sequential='layers' given is refused over ranks, not
    changed to True."""
    from helpers import distributed_calibration as calibrated
    from helpers.thread_group import on_threads

    config = Config(method="sparsegpt", amount=0.5, sequential="layers")

    def run(group: Any) -> str:
        model = calibrated.build()
        batches = calibrated.batches(0, 1)
        try:
            prune_model(model, config=config, calibration=batches, process_group=group)
        except ValueError as error:
            return str(error)
        return "pruned"

    for found in on_threads(2, run):
        assert "expected sequential=True with process_group" in found, found


# --- options of the calibrated methods beside the others ----------------------------------------


@pytest.mark.parametrize("given", ["keywords", "config"])
@pytest.mark.parametrize(("key", "value"), [("sequential", False), ("sequential", "layers"),
                                            ("progress", True)])  # fmt: skip
@pytest.mark.parametrize("method", ["l1", "random", "ln"])
def test_a_calibration_option_beside_a_method_without_data_is_refused(
    method: str, key: str, value: Any, given: str
) -> None:
    """sequential= and progress= shape the calibrated methods' runs; with l1, random or ln
    they were read and silently ignored (the masks the same whatever was given), and in a
    Config they still were after the keywords refused them."""
    model = _net()
    if given == "keywords":
        call = lambda: prune_model(model, 0.5, method=method, **{key: value})  # noqa: E731
    else:
        config = Config(method=method, amount=0.5, **{key: value})
        call = lambda: prune_model(model, config=config)  # noqa: E731
    refused(call, ValueError,
            rf"prune_model: {key}={value!r} applies to the calibrated methods \(wanda, "
            rf"sparsegpt, taylor\) only, not method='{method}', which would ignore it; "
            rf"expected no {key}",
            model=model)  # fmt: skip


@pytest.mark.parametrize("given", ["keywords", "config"])
@pytest.mark.parametrize("value", [True, False, "layers"])
def test_sequential_beside_taylor_is_refused(value: Any, given: str) -> None:
    """Taylor ranks by the gradients of whole-model backward passes, never block by block:
    sequential= was read and silently ignored with it (in a Config, after the keyword was
    refused, still)."""
    model = _net()
    batches = [torch.randn(4, 8)]
    if given == "keywords":
        call = lambda: prune_model(model, 0.5, method="taylor", sequential=value,  # noqa: E731
                                   calibration=batches, loss=_loss)  # fmt: skip
    else:
        config = Config(method="taylor", amount=0.5, sequential=value)
        call = lambda: prune_model(model, config=config, calibration=batches,  # noqa: E731
                                   loss=_loss)  # fmt: skip
    refused(call, ValueError,
            rf"prune_model: sequential={value!r} applies to the methods calibrated block by "
            rf"block \(wanda, sparsegpt\) only, not method='taylor', which would ignore it "
            rf"\(its gradients come from backward passes of the whole model\); expected no "
            rf"sequential \(None\) with method='taylor'",
            model=model)  # fmt: skip


@pytest.mark.parametrize("setting", [{"damp": (0.01, 0.5)}, {"blocksize": (4, 128)}])
def test_sparsegpts_settings_must_agree_over_ranks(setting: dict[str, tuple[Any, Any]]) -> None:
    """SparseGPT's damp and blocksize (None: its own) shape each rank's masks and updates
    after the statistics are reduced; the ranks compared every other option but not these,
    so two ranks given different ones pruned their copies differently, silently."""
    from helpers import distributed_calibration as calibrated
    from helpers.thread_group import on_threads

    ((key, values),) = setting.items()

    def run(group: Any) -> str:
        model = calibrated.build()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        config = Config(method="sparsegpt", amount=0.5, **{key: values[group.rank]})
        try:
            prune_model(model, config=config, calibration=calibrated.batches(group.rank, 2),
                        process_group=group)  # fmt: skip
        except ValueError as error:
            after = model.state_dict()
            assert after.keys() == before.keys()
            assert all(torch.equal(after[k], v) for k, v in before.items())
            return str(error)
        return "pruned"

    for found in on_threads(2, run):
        assert "the ranks were called with different arguments" in found, found
        assert f"{key}: {values[0]!r} on rank(s) [0], {values[1]!r} on rank(s) [1]" in found


@pytest.mark.parametrize("value", [1, 0.5, "yes"])
def test_a_bad_sequential_is_named_before_scope_global_reads_it(value: Any) -> None:
    """Config checked scope='global' with 'wanda' against `sequential` before checking
    `sequential` itself: a 1 or 'yes' was told to be sequential calibration, not invalid."""
    error = TypeError if not isinstance(value, str) else ValueError
    with pytest.raises(error, match=rf"^Config: invalid sequential={value!r}; expected True"):
        Config(method="wanda", amount=0.5, scope="global", sequential=value)
