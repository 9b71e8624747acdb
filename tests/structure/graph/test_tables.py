"""The graph's handler tables: every handler the graph has is in them, and a trace dispatches
through the tables it is given and nothing else (no handler registers itself on import)."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from prunekit.structure.families import attention, experts, mha
from prunekit.structure.graph.grouping import build_groups
from prunekit.structure.graph.tables import HANDLERS, MODULES, OPS
from prunekit.structure.handlers import module_handlers, norms, ops
from prunekit.structure.trace.tracer import Handlers, ModuleHandler, run_traced


def _op_handlers() -> list[object]:
    """The public functions of the handler modules that take (tracer, call)."""
    found = []
    for module in (module_handlers, ops):
        for name, value in vars(module).items():
            if name.startswith("_") or not inspect.isfunction(value):
                continue
            takes = list(inspect.signature(value).parameters)
            if value.__module__ == module.__name__ and takes == ["tr", "call"]:
                found.append(value)
    return found


def test_every_op_handler_of_the_graph_is_in_its_table() -> None:
    handlers = _op_handlers()
    assert len(handlers) == 15
    listed = {id(handler) for handler, _ in OPS.values()}
    assert [h for h in handlers if id(h) not in listed] == []


def test_every_module_handler_of_the_graph_is_in_its_table_in_order() -> None:
    found = [
        value
        for module in (attention, experts, mha, norms, module_handlers, ops)
        for value in vars(module).values()
        if isinstance(value, ModuleHandler)
    ]
    assert sorted(h.name for h in found) == sorted(h.name for h in MODULES)
    assert [h.name for h in MODULES] == ["attention", "router", "experts", "rms_norm"]


def test_the_live_table_starts_as_the_graphs_own() -> None:
    assert HANDLERS.own is OPS
    assert HANDLERS.ops == {name: handler for name, (handler, _) in OPS.items()}
    assert HANDLERS.ops is not OPS
    assert tuple(HANDLERS.modules) == MODULES


def test_a_trace_dispatches_through_the_tables_it_is_given_only() -> None:
    """With the graph's tables the two linear layers' hidden channels are one prunable
    group; with empty ones no op is known: no layer makes channels, and the layers' weights
    are left to the ops that read them."""
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    x = torch.randn(2, 4)
    known = build_groups(run_traced(model, (x,), {}, HANDLERS)[0])
    assert [g.size for g in known if g.prunable] == [6]
    tracer, _ = run_traced(model, (x,), {}, Handlers())
    assert build_groups(tracer) == []
    assert tracer.unclaimed[("0", "weight")] == ["linear (in 0)"]
    assert tracer.unclaimed[("2", "weight")] == ["linear (in 2)"]
