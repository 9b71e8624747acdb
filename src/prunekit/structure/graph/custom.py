"""Handlers registered by users: how their own ops and modules map channels through the graph.

``register_op_handler`` and ``register_module_handler`` add to the graph's tables
(``structure.graph.tables.HANDLERS``), process-wide; each returns a ``HandlerRegistration`` whose
``remove()`` (or the end of its ``with`` block) puts back what was there before.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

import torch
from torch import Tensor, nn

from prunekit.structure.graph.tables import HANDLERS
from prunekit.structure.handlers.module_handlers import RMS_NORMS, linear
from prunekit.structure.trace.tracer import (
    METADATA,
    Call,
    Handler,
    ModuleHandler,
    Tracer,
    describe_op,
)

__all__ = ["HandlerRegistration", "register_module_handler", "register_op_handler"]

OpBehaviour = Literal["elementwise", "blocked"]
ModuleBehaviour = Literal["elementwise", "blocked", "linear"]
ModuleTrace = Callable[[Tracer, nn.Module, tuple[Any, ...], dict[str, Any], Any], None]

_OP_BEHAVIOURS = ("elementwise", "blocked")
_MODULE_BEHAVIOURS = ("elementwise", "blocked", "linear")
_USER_MODULES: dict[type, ModuleHandler] = {}  # the module handlers registered here, by class


class HandlerRegistration:
    """A registered handler: ``remove()`` (or leaving its ``with`` block) unregisters it and
    puts back the handler it replaced, if any. Removing twice does nothing more.

    ``register_op_handler`` and ``register_module_handler`` return one; there is no need to
    make one yourself.

    Args:
        undo: what unregisters the handler and puts back the one it replaced; called at most
            once.
    """

    def __init__(self, undo: Callable[[], None]) -> None:
        self._undo: Callable[[], None] | None = undo

    def remove(self) -> None:
        """Unregister the handler (and restore the one it replaced)."""
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    def __enter__(self) -> HandlerRegistration:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


def _name_of(op: object) -> str:
    """The op name the tracer dispatches on: ``torch.cat``, ``Tensor.cat_``, ``"cat"`` ->
    'cat'. Raises TypeError for anything else (a class included)."""
    if isinstance(op, str):
        name = op
        if not name or not name.replace("_", "").isalnum():
            raise ValueError(
                f"register_op_handler: invalid op={op!r}; expected the name of a torch "
                "function or tensor method (such as 'special_expit') or the function itself"
            )
    elif isinstance(op, type) or not callable(op) or not hasattr(op, "__name__"):
        extra = ""
        if isinstance(op, type) and issubclass(op, nn.Module):
            extra = " (a module class goes to prunekit.register_module_handler)"
        raise TypeError(
            f"register_op_handler: invalid op={op!r} of type {type(op).__name__}; expected a "
            f"torch function or tensor method (such as torch.special.expit) or its name{extra}"
        )
    else:
        owner = getattr(op, "__self__", None)
        if isinstance(owner, type) and issubclass(owner, torch.autograd.Function):
            raise TypeError(
                f"register_op_handler: invalid op={op!r}; the graph sees the torch ops inside a "
                "custom autograd Function, never its apply: call it in a module of its own and "
                "register that with prunekit.register_module_handler"
            )
        name = op.__name__
    if name in METADATA:
        raise ValueError(
            f"register_op_handler: invalid op={op!r}; {name!r} returns metadata (no tensor), "
            "which the graph never counts as a use of the channels"
        )
    if name.startswith("__") and name.endswith("__"):
        return name
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


def _elementwise_op(tr: Tracer, call: Call) -> None:
    """The output carries the first tensor's channels, position by position."""
    x = call.arg(0, "input")
    labels = tr.label(x)
    others = [a for a in (*call.args[1:], *call.kwargs.values()) if isinstance(a, Tensor)]
    if any(tr.label(a) is not None for a in others):
        for a in (x, *others):
            tr.block(tr.label(a), f"{describe_op(call)} is element-wise in its first tensor only")
        return
    out = call.out
    if labels is None or not isinstance(out, Tensor):
        return
    if out.shape != labels.shape:
        tr.block(labels, f"{describe_op(call)} is registered element-wise but changes the shape")
        return
    tr.set(out, labels)


def _blocked_op(tr: Tracer, call: Call) -> None:
    for t in (*call.args, *call.kwargs.values()):
        if isinstance(t, Tensor):
            tr.block(tr.label(t), f"{describe_op(call)} is registered as blocking them")


def register_op_handler(
    op: str | Callable[..., Any],
    handler: OpBehaviour | Handler,
    *,
    replace: bool = False,
) -> HandlerRegistration:
    """Tell the channel graph how an op maps channels (``channel_groups``, ``prune_channels``,
    ``compact`` and everything built on them), process-wide.

    An op the graph has no handler for blocks the channels that reach it; registering one
    lets them through. The op is matched by name, so ``torch.special.expit`` also covers
    ``Tensor.special_expit`` and an in-place ``op_``.

    Args:
        op: a torch function or tensor method (``torch.special.expit``), or its name.
        handler: ``"elementwise"``: the output carries the channels of the first tensor
            argument, entry by entry (an activation; other tensor arguments must carry no
            channels, or all are blocked). ``"blocked"``: the channels reaching the op are
            left alone. Or (advanced) a callable ``handler(tracer, call)``: ``call.name``,
            ``call.args``, ``call.kwargs``, ``call.out``, ``call.where`` (the module it ran in)
            and ``call.arg(index, keyword)``; it reads input labels with
            ``tracer.label(tensor)`` (one channel id per entry, -1 for none; None for a tensor
            with no channels), and sets ``tracer.set(call.out, labels)`` (labels of the
            output's shape), ``tracer.merge(a, b)`` (ids that must be pruned together) or
            ``tracer.block(ids, reason)``. An output left without labels carries no
            channels, as if it depended on none: block the inputs' ids when it does.
        replace: allow replacing a handler already registered for the op (one of the graph's
            own, or one registered before).

    Returns:
        A ``HandlerRegistration``: ``remove()`` it, or use it as a ``with`` block, to restore
        the registry as it was.

    Raises:
        TypeError: `op` is not a function, method or name, `handler` is neither a known
            behaviour nor callable, or `replace` is not a bool.
        ValueError: `handler` is an unknown behaviour name, `op` an empty or invalid name, or
            the op has a handler already and `replace` is False.
    """
    name = _name_of(op)
    chosen = _handler(handler)
    _check_replace("register_op_handler", replace)
    if name in HANDLERS.ops and not replace:
        raise ValueError(
            f"register_op_handler: op={name!r} has a handler already; pass replace=True to "
            "trace it with yours instead"
        )
    previous = HANDLERS.ops.get(name)
    HANDLERS.ops[name] = chosen

    def undo() -> None:
        if HANDLERS.ops.get(name) is not chosen:
            return  # replaced since: that registration's own remove() restores
        if previous is None:
            del HANDLERS.ops[name]
        else:
            HANDLERS.ops[name] = previous

    return HandlerRegistration(undo)


def _handler(handler: object) -> Handler:
    if isinstance(handler, str):
        if handler not in _OP_BEHAVIOURS:
            raise ValueError(
                f"register_op_handler: invalid handler={handler!r}; expected one of "
                f"{', '.join(map(repr, _OP_BEHAVIOURS))} or a callable (tracer, call) -> None"
            )
        return _elementwise_op if handler == "elementwise" else _blocked_op
    if not callable(handler):
        raise TypeError(
            f"register_op_handler: invalid handler={handler!r} of type "
            f"{type(handler).__name__}; expected 'elementwise', 'blocked' or a callable "
            "(tracer, call) -> None"
        )
    return handler


def _check_replace(function: str, replace: object) -> None:
    if not isinstance(replace, bool):
        raise TypeError(f"{function}: invalid replace={replace!r}; expected True or False")


def _where(tr: Tracer, module: nn.Module) -> str:
    return f"{type(module).__name__} (in {tr.names.get(id(module)) or 'the model'})"


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else next(iter(kwargs.values()), None)


def _elementwise_module(tr: Tracer, module: nn.Module, args: tuple[Any, ...],
                        kwargs: dict[str, Any], out: Any) -> None:  # fmt: skip
    call = Call(type(module).__name__, args, kwargs, out, tr.names.get(id(module), ""))
    _elementwise_op(tr, call)


def _blocked_module(tr: Tracer, module: nn.Module, args: tuple[Any, ...],
                    kwargs: dict[str, Any], out: Any) -> None:  # fmt: skip
    for t in (*args, *kwargs.values()):
        if isinstance(t, Tensor):
            tr.block(tr.label(t), f"{_where(tr, module)} is registered as blocking them")


def _linear_module(tr: Tracer, module: nn.Module, args: tuple[Any, ...],
                   kwargs: dict[str, Any], out: Any) -> None:  # fmt: skip
    """``out = x @ module.weight.T + module.bias`` over the last dim, as nn.Linear."""
    x = _first_tensor(args, kwargs)
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    fits = (
        isinstance(x, Tensor)
        and isinstance(out, Tensor)
        and isinstance(weight, Tensor)
        and weight.dim() == 2
        and x.shape[-1:] == weight.shape[1:]
        and out.shape == (*x.shape[:-1], weight.shape[0])
        and (bias is None or (isinstance(bias, Tensor) and bias.shape == weight.shape[:1]))
    )
    if not fits:
        tr.block(
            tr.label(x),
            f"{_where(tr, module)} is registered as 'linear' but its weight (out, in), bias "
            "and output do not fit its input",
        )
        return
    call = Call("linear", (x, weight, bias), {}, out, tr.names.get(id(module), ""))
    linear(tr, call)  # the graph's own, even if a user replaced it


def register_module_handler(
    module_class: type[nn.Module],
    handler: ModuleBehaviour | ModuleTrace,
    *,
    replace: bool = False,
) -> HandlerRegistration:
    """Tell the channel graph how a module class maps channels, traced as a whole (the ops of
    its forward are not traced one by one), process-wide.

    Instances of `module_class` and of its subclasses match; the last class registered that
    matches a module wins, ahead of the graph's own module handlers (attention, RMSNorm,
    experts).

    Args:
        module_class: an ``nn.Module`` subclass.
        handler: ``"elementwise"``: the output carries the channels of the first input,
            entry by entry (the module has no parameter along the channels).
            ``"blocked"``: the channels reaching the module are left alone. ``"linear"``:
            ``out = x @ weight.T + bias`` over the last dim, as ``nn.Linear``, with the
            module's ``weight`` of shape (out, in) and optional ``bias``: its input channels
            and its output rows are pruned with their groups. Or (advanced) a callable
            ``handler(tracer, module, args, kwargs, out)`` that sets the labels of `out` as an
            op handler does (see ``register_op_handler``).
        replace: allow replacing a handler registered before for this class, or tracing a
            class of ``torch.nn`` (or a known RMSNorm) that the graph handles through its ops.

    Returns:
        A ``HandlerRegistration``: ``remove()`` it, or use it as a ``with`` block, to restore
        the registry as it was.

    Raises:
        TypeError: `module_class` is not an nn.Module subclass, `handler` is neither a known
            behaviour nor callable, or `replace` is not a bool.
        ValueError: `handler` is an unknown behaviour name, or the class is handled already
            and `replace` is False.
    """
    _check_class(module_class)
    trace = _module_trace(handler)
    _check_replace("register_module_handler", replace)
    _check_free(module_class, replace)
    cls = module_class
    blind = isinstance(handler, str)  # the graph's own behaviours read no value
    entry = ModuleHandler(f"user:{cls.__qualname__}", lambda m: isinstance(m, cls), trace, blind)
    return HandlerRegistration(_insert(cls, entry))


def _check_class(module_class: object) -> None:
    if not isinstance(module_class, type) or not issubclass(module_class, nn.Module):
        shown = module_class if isinstance(module_class, type) else type(module_class).__name__
        raise TypeError(
            f"register_module_handler: invalid module_class of type {shown}; expected an "
            "nn.Module subclass (the class, not an instance)"
        )


def _check_free(module_class: type[nn.Module], replace: bool) -> None:
    """Refuse a class registered here before, or one the graph traces, unless `replace`."""
    known = module_class.__module__.startswith("torch.nn.") or module_class.__name__ in RMS_NORMS
    if (module_class in _USER_MODULES or known) and not replace:
        why = "has a handler already" if module_class in _USER_MODULES else "is traced already"
        raise ValueError(
            f"register_module_handler: module_class={module_class.__name__} {why}; pass "
            "replace=True to trace it with yours instead"
        )


def _insert(cls: type[nn.Module], entry: ModuleHandler) -> Callable[[], None]:
    """Put `entry` first among the module handlers, in place of the one registered here for
    `cls` before; return what undoes it."""
    previous = _USER_MODULES.get(cls)
    if previous is not None:
        HANDLERS.modules.remove(previous)
    _USER_MODULES[cls] = entry
    HANDLERS.modules.insert(0, entry)

    def undo() -> None:
        if _USER_MODULES.get(cls) is not entry:
            return  # replaced since: that registration's own remove() restores
        HANDLERS.modules.remove(entry)
        if previous is None:
            del _USER_MODULES[cls]
        else:
            _USER_MODULES[cls] = previous
            HANDLERS.modules.insert(0, previous)

    return undo


def _module_trace(handler: object) -> ModuleTrace:
    if isinstance(handler, str):
        behaviours = {
            "elementwise": _elementwise_module,
            "blocked": _blocked_module,
            "linear": _linear_module,
        }
        if handler not in behaviours:
            raise ValueError(
                f"register_module_handler: invalid handler={handler!r}; expected one of "
                f"{', '.join(map(repr, _MODULE_BEHAVIOURS))} or a callable "
                "(tracer, module, args, kwargs, out) -> None"
            )
        return behaviours[handler]
    if not callable(handler):
        raise TypeError(
            f"register_module_handler: invalid handler={handler!r} of type "
            f"{type(handler).__name__}; expected 'elementwise', 'blocked', 'linear' or a "
            "callable (tracer, module, args, kwargs, out) -> None"
        )
    return handler
