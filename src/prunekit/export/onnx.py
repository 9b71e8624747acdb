"""``export(model, path, "onnx")``: a compacted CNN or encoder as one ONNX file, checked by
ONNX Runtime.

The graph is traced by ``torch.onnx.export`` (the exporter built on ``torch.export``, with
onnxscript) on the example inputs, in eval mode, with the weights inside the one file. The
first axis of every input that shares the first input's batch size is dynamic (``batch``),
and so is the second axis of integer inputs of rank 2 or more, such as token ids and
attention masks (``sequence``). An axis the trace fixes stays fixed, at a size the model's
code needs, and the report says so. A batch of 1, and a sequence of 1 (one token), are
traced on the example repeated to 2 along that axis (torch.export takes a size of 1 for a
constant: a causal LM's code fixed its batch at 1, and its attention failed on the undecided
length), and checked on the example as given; where the model takes no 2, the axis is traced
fixed at 1, and where the graph traced on 2 fixes the axis at 2, it is refused (the file
would not take the example). Once written, the file is read back by ONNX Runtime (where
installed) and run on the example inputs and on them twice over along the batch axis
(unless the batch is fixed): every output must be within ``TOLERANCE`` x its largest
magnitude of the model's (``HALF_TOLERANCE`` for an output in float16 or bfloat16), or
nothing lands. A bfloat16 graph, which ONNX Runtime's CPU kernels do not run, is refused
unless written as float32 or unchecked. A causal LM is traced without its key/value cache
(``use_cache`` off for the call): the graph gives the logits.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from prunekit._extras import require
from prunekit.calibrate import evaluating, example_error
from prunekit.core.difference import larger, largest_difference
from prunekit.core.errors import type_error, value_error
from prunekit.core.signature import forward_parameters
from prunekit.dropin.hooks import pruning_hooks
from prunekit.export.request import ExportReport, Request

__all__ = ["DTYPES", "HALF_TOLERANCE", "TOLERANCE", "write"]

TOLERANCE = 1e-4
"""The largest difference allowed between ONNX Runtime's outputs and the model's, as a share
of the largest magnitude of each output."""
HALF_TOLERANCE = 1e-2
"""``TOLERANCE`` for an output in float16 or bfloat16 (an ulp of float16 is about 1e-3 of
the value: ONNX Runtime and torch round the sums of a half graph apart by a few)."""

DTYPES = (None, "float32")
"""The values of ``dtype`` it takes: None keeps the model's own (float32 for ONNX Runtime's
CPU kernels), "float32" writes a float32 copy of a model held in another precision."""

# ONNX keeps a model whose weights are inside the file under protobuf's 2 GiB limit
_LIMIT = 2**31 - 2**20
OWNER = "export(format='onnx')"

Named = list[tuple[str, Tensor]]
Shapes = dict[str, dict[int, Any]]
# (positional inputs, keyword inputs, every input's name, their dynamic axes)
Inputs = tuple[tuple[Tensor, ...], dict[str, Tensor], list[str], Shapes]


def write(model: nn.Module, target: Path, request: Request) -> ExportReport:
    """Write `model` to `target` as one ONNX file, then check it with ONNX Runtime.

    Args:
        model: a compacted model (no pruning masks left) whose forward takes tensors.
        target: the file to write (a staged path; ``request.path`` is where it lands).
        request: the checked arguments of ``export``; ``example_inputs`` is required: a
            tensor, a tuple of tensors (positional) or a dict of tensors (keyword; None
            values are left out).

    Returns:
        The report: the file, and ONNX Runtime's largest relative difference where checked.

    A config asking for a key/value cache (a causal LM's ``use_cache=True``) has it off
    while the graph is traced and checked (the cache is no tensor: the graph outputs the
    logits), and on again afterwards, also on an error.

    Raises:
        ValueError: no example inputs, example inputs without values (meta, empty), holding
            NaN or inf where the file is checked, or that the model cannot take (naming
            them, before anything is traced), a dtype it does not write, a model still holding
            pruning masks (compact it first), one too large for one ONNX file, weights or
            inputs in bfloat16 that the check would run (ONNX Runtime's CPU kernels take
            none; dtype='float32' or verify=False), or example inputs whose batch or
            sequence of 1, traced on 2, the trace fixed at 2 (the model's code specializes
            it); nothing is written.
        TypeError: example inputs or outputs that are not tensors.
        RuntimeError: ONNX Runtime's outputs differ from the model's; nothing lands.
    """
    args, kwargs = _inputs(request.example_inputs)
    _check_values(args, kwargs, request.verify)
    _check_dtype(request.dtype)
    _refuse_masked(model)
    _refuse_large(model)
    require("onnxscript", "export", "export(format='onnx')")
    if request.dtype == "float32" and any(p.dtype != torch.float32 for p in model.parameters()):
        model = copy.deepcopy(model).float()
        args, kwargs = _float32(args), _float32(kwargs)
    elif request.verify and importlib.util.find_spec("onnxruntime") is not None:
        _refuse_unrunnable(model, args, kwargs)
    names = _input_names(model, args, kwargs)
    shapes = _dynamic(args, kwargs, names)  # the trace's, the note's and the check's
    with _without_cache(model) as cached, evaluating(model), torch.no_grad():
        try:
            computed = model(*args, **kwargs)
        except Exception as error:
            raise example_error(OWNER, error)  # noqa: B904 (the cause is set on a new error)
        outputs = _outputs(computed)
        traced, changed, widened = _traced_inputs(model, (args, kwargs, names), shapes)
        proto = _exported(model, (*traced, names), shapes, [n for n, _ in outputs])
        fixed = _fixed_axes(proto, shapes, widened)
        Path(target).write_bytes(proto.SerializeToString())
        notes = [f"inputs {', '.join(names)}; outputs {', '.join(n for n, _ in outputs)}"]
        notes += changed + fixed
        if cached:
            notes.append("traced with use_cache=False: the graph keeps no key/value cache")
        if request.source is not None:
            notes.append("source: an ONNX file holds no tokenizer; none was written")
        return _checked(model, Path(target), request, (args, kwargs, names, shapes), notes)


def _checked(model: nn.Module, target: Path, request: Request, inputs: Inputs,
             notes: list[str]) -> ExportReport:  # fmt: skip
    """The report, after ONNX Runtime ran the file written (where asked and installed)."""
    if not request.verify:
        return ExportReport("onnx", request.path, (request.path.name,), notes=tuple(notes))
    try:
        ort = require("onnxruntime", "export", "checking an ONNX export")
    except ImportError:
        notes.append("not checked: onnxruntime is not installed")
        return ExportReport("onnx", request.path, (request.path.name,), notes=tuple(notes))
    diff, absolute = _verify(ort, model, target, *inputs)
    notes.append(f"largest absolute difference {absolute:.3g}")
    version = f"onnxruntime {ort.__version__}"
    return ExportReport("onnx", request.path, (request.path.name,), version, diff, tuple(notes))


@contextmanager
def _without_cache(model: nn.Module) -> Iterator[bool]:
    """Every config of `model`'s modules with ``use_cache`` on (a causal LM's: its forward
    would return a key/value cache, no tensor ONNX can output) has it off for the block,
    and back as it was after it, also on an error; yields whether one had it on."""
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}
    changed = [c for c in configs.values() if getattr(c, "use_cache", None) is True]
    try:
        for config in changed:
            config.use_cache = False
        yield bool(changed)
    finally:
        for config in changed:
            config.use_cache = True


def _inputs(example_inputs: Any) -> tuple[tuple[Tensor, ...], dict[str, Tensor]]:
    """The example inputs as positional and keyword tensors, or the error saying what fits."""
    if example_inputs is None:
        raise value_error(
            "export(format='onnx'): example_inputs=None; expected the inputs to trace the "
            "graph on: a tensor, a tuple of tensors or a dict of tensors, such as "
            "export(model, 'model.onnx', 'onnx', example_inputs=torch.randn(1, 3, 224, 224))"
        )
    if isinstance(example_inputs, Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        kwargs = {str(k): v for k, v in example_inputs.items() if v is not None}
        for key, value in kwargs.items():
            _check_tensor(value, f"example_inputs[{key!r}]")
        if not kwargs:
            raise value_error("export(format='onnx'): example_inputs holds no tensor")
        return (), kwargs
    if isinstance(example_inputs, Sequence) and not isinstance(example_inputs, str):
        for index, value in enumerate(example_inputs):
            _check_tensor(value, f"example_inputs[{index}]")
        if not example_inputs:
            raise value_error("export(format='onnx'): example_inputs is empty")
        return tuple(example_inputs), {}
    raise type_error(
        f"export(format='onnx'): example_inputs is a {type(example_inputs).__name__}; expected "
        "a tensor, a tuple of tensors or a dict of tensors"
    )


def _check_tensor(value: Any, where: str) -> None:
    if not isinstance(value, Tensor):
        raise type_error(
            f"export(format='onnx'): {where} is a {type(value).__name__}; expected a tensor "
            "(ONNX inputs are tensors)"
        )


def _check_values(args: tuple[Tensor, ...], kwargs: dict[str, Tensor], verify: bool) -> None:
    """Refuse example inputs the graph cannot be traced on (no values: on the meta device,
    or empty) or, where the written file is checked, compared on (floating with NaN or inf:
    NaN equals nothing, and an output of NaN or inf compares nothing)."""
    named = [(f"example_inputs[{i}]", t) for i, t in enumerate(args)]
    named += [(f"example_inputs[{k!r}]", t) for k, t in kwargs.items()]
    for where, tensor in named:
        wrong = None
        if tensor.is_meta:
            wrong = "is on the meta device (a shape without values); expected tensors with values"
        elif tensor.numel() == 0:
            wrong = (
                f"is empty (shape {tuple(tensor.shape)}): no value to trace or check on; "
                "expected tensors of at least one entry"
            )
        elif verify and not _finite(tensor):
            wrong = (
                "holds NaN or inf, on which the check cannot compare outputs; expected finite "
                "values (or verify=False to write the graph unchecked)"
            )
        if wrong is not None:
            raise value_error(f"{OWNER}: {where} {wrong}")


def _finite(tensor: Tensor) -> bool:
    """Whether `tensor` holds no NaN or inf (integers and bools always)."""
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return True
    return bool(torch.isfinite(tensor).all())


def _check_dtype(dtype: Any) -> None:
    if dtype not in DTYPES:
        raise value_error(
            f"export(format='onnx'): dtype={dtype!r} is not a type it writes; expected None "
            "(the model's own) or 'float32'"
        )


def _refuse_masked(model: nn.Module) -> None:
    """Refuse a model that still holds pruning masks: its graph would carry them."""
    for path, module in model.named_modules():
        hooks = pruning_hooks(module)
        if hooks:
            tensors = ", ".join(sorted({str(h._tensor_name) for h in hooks}))
            raise value_error(
                f"export(format='onnx'): module {path or type(model).__name__!r} still holds the "
                f"pruning masks of {tensors}; call prunekit.compact(model, example_inputs) "
                "first (or prunekit.remove for masks that stay as zeros)"
            )


def _refuse_unrunnable(
    model: nn.Module, args: tuple[Tensor, ...], kwargs: dict[str, Tensor]
) -> None:
    """Refuse, before tracing, a graph in bfloat16 that the check cannot run: ONNX Runtime's
    CPU kernels take no bfloat16 (it would fail loading the file, after all the work)."""
    named = [*model.named_parameters(), *model.named_buffers()]
    inputs = [(f"example_inputs[{i}]", t) for i, t in enumerate(args)]
    inputs += [(f"example_inputs[{k!r}]", t) for k, t in kwargs.items()]
    for where, tensor in [(f"model's {n}", t) for n, t in named] + inputs:
        if tensor.dtype == torch.bfloat16:
            raise value_error(
                f"export(format='onnx'): {where} is bfloat16, which ONNX Runtime's CPU "
                "kernels do not run, so the written file could not be checked; expected "
                "dtype='float32' (a float32 copy is written), or verify=False to write the "
                "bfloat16 graph unchecked"
            )


def _refuse_large(model: nn.Module) -> None:
    """Refuse weights beyond what one ONNX file holds (the exporter would write a data file)."""
    seen: set[int] = set()
    size = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            size += tensor.numel() * tensor.element_size()
    if size > _LIMIT:
        raise value_error(
            f"export(format='onnx'): {type(model).__name__} holds {size / 2**30:.2f} GiB of "
            "weights; one ONNX file holds at most 2 GiB; prune it further or use format='hf'"
        )


def _float32(value: Any) -> Any:
    """Floating tensors of `value` (a tuple or dict of tensors) as float32."""
    if isinstance(value, dict):
        return {k: _float32(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_float32(v) for v in value)
    return value.float() if isinstance(value, Tensor) and value.is_floating_point() else value


def _input_names(
    model: nn.Module, args: tuple[Tensor, ...], kwargs: dict[str, Tensor]
) -> list[str]:
    """The graph's input names: the forward's parameter names for positional inputs (or
    ``input_<i>`` where it takes ``*args``), the keys for keyword inputs."""
    parameters = forward_parameters(model) or []
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [named[i] if i < len(named) else f"input_{i}" for i in range(len(args))]
    return names + list(kwargs)


def _outputs(value: Any, prefix: str = "") -> Named:
    """The model's output as named tensors, in the order the exporter flattens it (a
    mapping, such as transformers' ModelOutput, by key, without its None values)."""
    if isinstance(value, Tensor):
        return [(prefix or "output", value)]
    if isinstance(value, Mapping):
        found: Named = []
        for key, item in value.items():
            if item is not None:
                found += _outputs(item, f"{prefix}.{key}" if prefix else str(key))
        return found
    if isinstance(value, Sequence) and not isinstance(value, str):
        found = []
        for index, item in enumerate(value):
            found += _outputs(item, f"{prefix or 'output'}_{index}")
        return found
    raise type_error(
        f"export(format='onnx'): the model's output {prefix or ''} is a {type(value).__name__}; "
        "expected tensors (in a tuple, list or dict): ONNX outputs are tensors"
    )


def _dynamic(args: tuple[Tensor, ...], kwargs: dict[str, Tensor], names: list[str]) -> Shapes:
    """Each input's dynamic axes: ``batch`` (dim 0, where its size is the first input's),
    ``sequence`` (dim 1 of an integer or boolean input of rank >= 2)."""
    tensors = [*args, *kwargs.values()]
    batch = torch.export.Dim("batch")
    sequence = torch.export.Dim("sequence")
    first = tensors[0].shape[0] if tensors[0].dim() else None
    shapes: Shapes = {}
    for name, tensor in zip(names, tensors, strict=True):
        axes: dict[int, Any] = {}
        if tensor.dim() and tensor.shape[0] == first:
            axes[0] = batch
        if tensor.dim() >= 2 and not tensor.is_floating_point() and not tensor.is_complex():
            axes[1] = sequence
        shapes[name] = axes
    return shapes


def _traced_inputs(
    model: nn.Module,
    inputs: tuple[tuple[Tensor, ...], dict[str, Tensor], list[str]],
    shapes: Shapes,
) -> tuple[tuple[tuple[Tensor, ...], dict[str, Tensor]], list[str], set[tuple[str, int]]]:
    """The inputs to trace on (positional, keyword), notes on what was changed, and the
    axes widened (input name, axis): the inputs whose dynamic batch axis holds 1 have it
    repeated to 2, and then those whose dynamic sequence axis holds 1. torch.export cannot
    keep an axis of 1 dynamic (it takes 1 for a constant), and code that tests the size
    fixes it at 1 (a causal LM's batch) or fails on it inside the trace (its attention:
    ``is_causal = length > 1``); the graph traced on 2 takes any size, and is checked on the
    example as given. A model that takes no 2 (its forward raises on them) is traced on its
    example's 1, the axis made static (`shapes` changed) and a note saying so."""
    args, kwargs, names = inputs
    notes: list[str] = []
    widened: set[tuple[str, int]] = set()
    for axis, label, unit in ((0, "batch", "a batch of 2"), (1, "sequence", "2 tokens")):
        given = {**dict(zip(names, args, strict=False)), **kwargs}
        ones = [n for n, axes in shapes.items() if axis in axes and given[n].shape[axis] == 1]
        if not ones:
            continue
        twice = {n: torch.cat([given[n]] * 2, dim=axis) for n in ones}
        wide_args = tuple(twice.get(n, t) for n, t in zip(names, args, strict=False))
        wide_kwargs = {k: twice.get(k, t) for k, t in kwargs.items()}
        try:
            model(*wide_args, **wide_kwargs)
        except Exception:  # the model's code takes a size of 1 only: its graph too
            for name in ones:
                del shapes[name][axis]
            notes += [
                f"axis {axis} ({label}) of input {n!r} is fixed at 1: the model's code takes "
                "no other size"
                for n in ones
            ]
            continue
        args, kwargs = wide_args, wide_kwargs
        widened.update((n, axis) for n in ones)
        listed = ", ".join(repr(n) for n in ones)
        notes.append(
            f"traced on {unit} (the example's one repeated along axis {axis} of {listed}): "
            f"a {label} of 1 may not stay dynamic in torch.export; checked on the example as "
            "given"
        )
    return (args, kwargs), notes, widened


def _fixed_axes(proto: Any, wanted: Shapes, widened: set[tuple[str, int]]) -> list[str]:
    """Notes on the axes meant to be dynamic that the trace fixed (the model's code needs
    that size); an axis of the example's 1, traced on 2 (`widened`), that the trace fixed
    at 2 is refused: the file would not take the example."""
    notes = []
    for graph_input in proto.graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        for axis in wanted.get(graph_input.name, {}):
            if axis >= len(dims) or not dims[axis].HasField("dim_value"):
                continue
            label, size = ("batch" if axis == 0 else "sequence"), dims[axis].dim_value
            if (graph_input.name, axis) in widened:
                raise value_error(
                    f"export(format='onnx'): traced on the example repeated to {size} along "
                    f"axis {axis} ({label}) of input {graph_input.name!r} (its 1 cannot stay "
                    f"dynamic), the graph fixes that axis at {size}: the model's code "
                    f"specializes the size, so the file would not take the example's 1; "
                    f"expected example_inputs whose {label} is the size the file is to take, "
                    "2 or more"
                )
            notes.append(
                f"axis {axis} ({label}) of input {graph_input.name!r} is fixed at {size}: the "
                "model's code needs that size"
            )
    return notes


def _exported(
    model: nn.Module,
    inputs: tuple[tuple[Tensor, ...], dict[str, Tensor], list[str]],
    shapes: Shapes,
    outputs: list[str],
) -> Any:
    """The ONNX ModelProto of `model` traced on the inputs (positional, keyword, their
    names) with the dynamic axes `shapes`, weights inside."""
    args, kwargs, names = inputs
    positional = dict(zip(names, args, strict=False))
    with warnings.catch_warnings(), _quiet("torch.onnx"):  # notes on its own internals
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.|copyreg")
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx")
        program = torch.onnx.export(
            model, (), kwargs={**positional, **kwargs}, dynamo=True, external_data=False,
            input_names=names, output_names=outputs, verbose=False,
            dynamic_shapes=shapes,
        )  # fmt: skip
    if program is None:  # the exporter returns a program whenever dynamo=True
        raise RuntimeError("torch.onnx.export returned no program")
    return program.model_proto


def _verify(
    ort: Any,
    model: nn.Module,
    path: Path,
    args: tuple[Tensor, ...],
    kwargs: dict[str, Tensor],
    names: list[str],
    shapes: Shapes,
) -> tuple[float, float]:
    """ONNX Runtime's largest difference from the model (relative, absolute) on the inputs
    and on them doubled along the batch axis (of `shapes`, the trace's dynamic axes); raise
    beyond ``TOLERANCE``."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    wanted = [i.name for i in session.get_inputs()]
    held = {i.name: i.shape for i in session.get_inputs()}
    fixed = any(0 in axes and isinstance(held.get(name, [None])[0], int)
                for name, axes in shapes.items())  # fmt: skip
    worst, absolute = 0.0, 0.0
    for twice in (False,) if fixed else (False, True):  # a fixed batch is not doubled
        feed_args = tuple(_doubled(t, shapes[n], twice) for n, t in zip(names, args, strict=False))
        feed_kwargs = {k: _doubled(t, shapes[k], twice) for k, t in kwargs.items()}
        expected = _outputs(model(*feed_args, **feed_kwargs))
        inputs = dict(zip(names, [*feed_args, *feed_kwargs.values()], strict=True))
        found = session.run(None, {n: inputs[n].numpy() for n in wanted})
        for (name, reference), result in zip(expected, found, strict=True):
            diff, scale = _difference(reference, np.asarray(result), name)
            relative = diff / scale if scale else diff
            worst, absolute = larger(worst, relative), larger(absolute, diff)
            half = reference.dtype in (torch.float16, torch.bfloat16)
            allowed = HALF_TOLERANCE if half else TOLERANCE
            if not relative <= allowed:
                raise RuntimeError(
                    f"export(format='onnx'): ONNX Runtime's output {name!r} differs from the "
                    f"model's by {diff:.3g} (largest output {scale:.3g}, tolerance {allowed:g} "
                    f"x that{', batch doubled' if twice else ''}); nothing was written"
                )
    return worst, absolute


def _doubled(tensor: Tensor, axes: dict[int, Any], twice: bool) -> Tensor:
    """`tensor`, or, where `twice` and its first axis is the batch, it twice over (reversed
    the second time, so the rows differ where the batch has several)."""
    if not twice or 0 not in axes:
        return tensor
    return torch.cat([tensor, tensor.flip(0)])


def _difference(reference: Tensor, found: np.ndarray[Any, Any], name: str) -> tuple[float, float]:
    """Largest |difference| and largest finite |reference| of one output (``core.difference``:
    NaN on either side is a difference, equal infinities are none)."""
    expected = reference.detach().double()
    if tuple(found.shape) != tuple(expected.shape):
        raise RuntimeError(
            f"export(format='onnx'): ONNX Runtime's output {name!r} has shape "
            f"{tuple(found.shape)}, not {tuple(expected.shape)}; nothing was written"
        )
    return largest_difference(expected, torch.from_numpy(np.array(found, dtype=np.float64)))


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """The logger `name` (and those below it) at errors only for the block."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
