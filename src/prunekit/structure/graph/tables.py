"""What the tracer dispatches to: the graph's handler tables, declared and filled here only.

Each op name goes to one handler of ``structure.handlers`` with the operands it is blind to
(see ``trace.skim``); each module a module handler matches (attention and experts from
``structure.families``, RMSNorm from ``structure.handlers.norms``) is traced whole, the first
match winning. Nothing registers itself on import: a handler the graph gains is written
here. A user's own handlers go through ``prunekit.register_op_handler`` and
``prunekit.register_module_handler`` (``graph.custom``), which change ``HANDLERS`` while the
program runs and can be undone.
"""

from __future__ import annotations

from collections.abc import Iterable

from prunekit.structure.families.attention import ATTENTION_HANDLER
from prunekit.structure.families.experts import EXPERTS_HANDLER, ROUTER_HANDLER
from prunekit.structure.handlers import module_handlers, ops
from prunekit.structure.handlers.norms import RMS_NORM_HANDLER
from prunekit.structure.trace.skim import Blind
from prunekit.structure.trace.tracer import Handler, Handlers, ModuleHandler

__all__ = ["HANDLERS", "MODULES", "OPS"]


def _each(names: Iterable[str], handler: Handler, blind: Blind) -> dict[str, tuple[Handler, Blind]]:
    return dict.fromkeys(names, (handler, blind))


# the graph's own op handlers: op name -> (handler, the operands it and the op's output shape
# are blind to)
OPS: dict[str, tuple[Handler, Blind]] = {
    # layers, called by their modules or functionally
    **_each(("conv1d", "conv2d", "conv3d"), module_handlers.conv, "all"),
    **_each(("linear",), module_handlers.linear, "all"),
    **_each(("batch_norm", "instance_norm"), module_handlers.batch_norm, "all"),
    **_each(("group_norm",), module_handlers.group_norm, "all"),
    **_each(("layer_norm", "rms_norm"), module_handlers.layer_norm, "all"),
    **_each(("addmm",), module_handlers.addmm, "all"),
    **_each(("prelu",), module_handlers.prelu, "all"),
    **_each(("embedding",), module_handlers.embedding, "none"),
    # tensor ops
    **_each(ops.UNARY, ops.unary, "all"),
    **_each(ops.BINARY, ops.binary, "all"),
    **_each(ops.MOVES, ops.move, "first"),
    **_each(ops.POOLS, ops.pool, "all"),
    **_each(ops.REDUCE, ops.reduce, "all"),
    **_each(ops.ALONG_DIM, ops.along_dim, "all"),
    **_each(ops.CONTRACTS, ops.contracts, "all"),
}

# the graph's own module handlers, in the order they are tried
MODULES: tuple[ModuleHandler, ...] = (
    ATTENTION_HANDLER,
    ROUTER_HANDLER,
    EXPERTS_HANDLER,
    RMS_NORM_HANDLER,
)

# what every trace dispatches to: the graph's own handlers, and the ones users register
HANDLERS = Handlers(
    ops={name: handler for name, (handler, _) in OPS.items()},
    own=OPS,
    modules=list(MODULES),
)
