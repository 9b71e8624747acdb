"""The shape of the library in counts, read from its source (issue 48's figures).

    PYTHONPATH=src python benchmarks/house.py             # the counts
    PYTHONPATH=src python benchmarks/house.py --verbose   # and what each count is made of

Everything is read from the AST of ``src/prunekit`` (the public API alone is found by importing
``prunekit`` and reading its ``__all__``):

- **import cycles**: the packages are the nodes (a module belongs to the package that holds it;
  the modules directly under ``prunekit/`` are nodes of their own), every import of a
  ``prunekit`` module is an edge, at the top of a module or inside a function, but not under
  ``if TYPE_CHECKING:`` (those never run). A package's ``__init__`` importing its own
  subpackages is its public face, not an edge. A cycle is a strongly connected component of
  more than one package; the cycles between the modules of one package are counted apart.
- **function-local imports**: import statements inside a function body (outside
  ``TYPE_CHECKING`` blocks), of ``prunekit`` modules and of other libraries.
- **Any**: parameters and return values annotated exactly ``Any``, everywhere and in the
  public API (the functions in ``prunekit.__all__``, and the methods the classes in it define
  or inherit from prunekit classes: public ones, ``__init__`` and ``__call__``).
- **long signatures**: functions with more than 8 parameters (``self`` / ``cls`` not counted,
  nor one parameter named ``config`` or annotated with a ``...Config`` class), in the public
  API and among every public name (no leading underscore) of the library.
- **long functions**: functions whose ``def`` spans more than 60 lines (docstring included).
- **climbs back up**: an argument followed from its entry point (``budget`` from
  ``prune_channels``, ``calibration`` and ``method`` from ``prune_model``) through the static
  call graph. In each function the names that carry it are found (the parameter, names
  assigned from an expression that reads it, an object built with it as a keyword: then only
  ``obj.<keyword>`` carries it); every call that passes one on is followed into the prunekit
  function it resolves to (through the module's imports, ``self.``, a parameter's annotated
  class) with the parameters that receive it. A call whose callee's package is already on
  the chain of callers, but is not the caller's, climbs back up: the flow went down into a
  package and comes back to one it left. Printed: the packages and files it visits and the
  climbs (with ``--verbose``, the calls).
- **registrations at import time**: statements that run when a module is imported (at module
  level or in a class body) and fill a table: a decorator whose name says ``register``, a call
  of a function whose name says ``register``, ``TABLE.append / extend / insert / update /
  setdefault / add(...)`` and ``TABLE[key] = value`` on a module-level name.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src"
if "--source" in sys.argv:  # another checkout's sources (to compare before and after)
    ROOT = Path(sys.argv[sys.argv.index("--source") + 1]).resolve()
PACKAGE = "prunekit"
MAX_PARAMETERS = 8
MAX_LINES = 60
_FILLS = {"append", "extend", "insert", "update", "setdefault", "add"}


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    is_package: bool
    imports: list[tuple[str, bool]] = field(default_factory=list)  # (target, in a function)
    local_imports: list[tuple[int, str]] = field(default_factory=list)  # (line, what)


def modules() -> dict[str, Module]:
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join(parts)
        found[name] = Module(name, path, ast.parse(path.read_text(), str(path)), is_package)
    for module in found.values():
        _read_imports(module, found)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node that runs (TYPE_CHECKING blocks left out), with whether it is in a function."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other, in_function
                yield from _walk(other, in_function)
            continue
        yield child, in_function
        inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        yield from _walk(child, inner)


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    base = base if module.is_package else base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _read_imports(module: Module, known: dict[str, Module]) -> None:
    for node, in_function in _walk(module.tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        if in_function:
            module.local_imports.append((node.lineno, ", ".join(sorted(set(targets)))))
        for target in targets:
            while target and target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known:
                module.imports.append((target, in_function))


def node_of(module: Module) -> str:
    """The package a module belongs to (a module directly under prunekit/: itself)."""
    if module.is_package:
        return module.name
    parent = module.name.rsplit(".", 1)[0]
    return module.name if parent == PACKAGE else parent


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return sorted(found)


def cycles(found: dict[str, Module]) -> tuple[list[list[str]], list[list[str]]]:
    """The cycles between packages, and between the modules of one package."""
    packages: dict[str, set[str]] = {}
    within: dict[str, set[str]] = {}
    for module in found.values():
        for target in (t for t, _ in module.imports):
            if module.is_package and target.startswith(module.name + "."):
                continue  # a package's face, importing what it holds
            a, b = node_of(module), node_of(found[target])
            if a != b:
                packages.setdefault(a, set()).add(b)
            elif target != module.name and not found[target].is_package:
                within.setdefault(module.name, set()).add(target)
    return _strongly_connected(packages), _strongly_connected(within)


@dataclass
class Function:
    module: str
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    method: bool  # its first parameter is self / cls

    @property
    def where(self) -> str:
        return f"{self.module}.{self.qualname}"

    def parameters(self) -> list[ast.arg]:
        a = self.node.args
        every = [*a.posonlyargs, *a.args, *a.kwonlyargs]
        every += [x for x in (a.vararg, a.kwarg) if x is not None]
        return every[1:] if self.method and every else every

    def count(self) -> int:
        """Its parameters, less one config object."""
        found = self.parameters()
        config = any(p.arg == "config" or _names_config(p.annotation) for p in found)
        return len(found) - int(config)

    def any_annotations(self) -> int:
        annotations = [p.annotation for p in self.parameters()] + [self.node.returns]
        return sum(_is_any(a) for a in annotations)

    def lines(self) -> int:
        return (self.node.end_lineno or self.node.lineno) - self.node.lineno + 1


def _annotation(node: ast.expr | None) -> ast.expr | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    return node


def _is_any(node: ast.expr | None) -> bool:
    node = _annotation(node)
    return (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any"
    )


def _names_config(node: ast.expr | None) -> bool:
    node = _annotation(node)
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return isinstance(name, str) and name.endswith("Config")


def functions(found: dict[str, Module]) -> list[Function]:
    every: list[Function] = []

    def visit(node: ast.AST, module: str, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, module, f"{prefix}{child.name}.", True)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                static = any(
                    isinstance(d, ast.Name) and d.id == "staticmethod" for d in child.decorator_list
                )
                every.append(Function(module, prefix + child.name, child, in_class and not static))
                visit(child, module, f"{prefix}{child.name}.<locals>.", False)
            else:
                visit(child, module, prefix, in_class)

    for module in found.values():
        visit(module.tree, module.name, "", False)
    return every


def public_api() -> set[str]:
    """module.qualname of every function and method of the public API."""
    sys.path.insert(0, str(ROOT))
    import prunekit  # the source read above is the one imported

    names: set[str] = set()
    for name in prunekit.__all__:
        obj = inspect.unwrap(getattr(prunekit, name))
        if inspect.isfunction(obj):
            names.add(f"{obj.__module__}.{obj.__qualname__}")
        elif inspect.isclass(obj):
            for cls in obj.__mro__:
                if not cls.__module__.startswith(PACKAGE):
                    continue
                for attr in vars(cls):
                    if not attr.startswith("_") or attr in ("__init__", "__call__"):
                        names.add(f"{cls.__module__}.{cls.__qualname__}.{attr}")
    return names


def _is_public(function: Function) -> bool:
    parts = [*function.module.split("."), *function.qualname.split(".")]
    hidden = [p for p in parts if p.startswith("_") and p not in ("__init__", "__call__")]
    return not hidden and "<locals>" not in function.qualname


def _called_name(node: ast.expr) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def registrations(found: dict[str, Module]) -> list[str]:
    """Where a table is filled while a module is imported."""
    places = []

    def visit(body: list[ast.stmt], module: str) -> None:
        for stmt in body:
            where = f"{module}:{stmt.lineno}"
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                for decorator in stmt.decorator_list:
                    if "register" in _called_name(decorator).lower():
                        places.append(f"{where} @{_called_name(decorator)} {stmt.name}")
                if isinstance(stmt, ast.ClassDef):
                    visit(stmt.body, module)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                func = stmt.value.func
                name = _called_name(stmt.value)
                table = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                if "register" in name.lower() or (table and name in _FILLS):
                    places.append(f"{where} {ast.unparse(func)}(...)")
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                        places.append(f"{where} {ast.unparse(target)} = ...")
            elif isinstance(stmt, ast.If | ast.Try | ast.With):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(stmt, block, []), module)

    for module in found.values():
        visit(module.tree.body, module.name)
    return places


@dataclass(frozen=True)
class Carried:
    """A name that carries the followed value: itself, or (`field`) its attribute `field`."""

    name: str
    field: str | None = None


@dataclass
class Flow:
    """What following one argument found."""

    calls: list[tuple[int, str, str]] = field(default_factory=list)  # depth, caller, callee
    climbs: list[str] = field(default_factory=list)

    def packages(self, found: dict[str, Module]) -> list[str]:
        seen = [_package(c, found) for _, _, c in self.calls]
        return sorted(set(seen))


def _package(where: str, found: dict[str, Module]) -> str:
    module = where
    while module not in found and "." in module:
        module = module.rsplit(".", 1)[0]
    return node_of(found[module])


def _module_of(where: str, found: dict[str, Module]) -> str:
    module = where
    while module not in found and "." in module:
        module = module.rsplit(".", 1)[0]
    return module


class Follower:
    """Follows one value through the static call graph of prunekit (see the module's doc)."""

    def __init__(self, found: dict[str, Module], every: list[Function]) -> None:
        self._closures: dict[str, Carried] = {}
        self._depth = 0
        self._func: Function | None = None
        self._types: dict[str, str] = {}
        self.found = found
        self.functions = {f.where: f for f in every}
        self.classes: set[str] = set()
        self.names: dict[str, dict[str, str]] = {}
        for module in found.values():
            self.names[module.name] = self._names(module)

    def _names(self, module: Module) -> dict[str, str]:
        names: dict[str, str] = {}
        for node in module.tree.body:
            if isinstance(node, ast.ImportFrom):
                base = _resolve(module, node)
                for a in node.names:
                    names[a.asname or a.name] = f"{base}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        names[a.asname] = a.name
                    else:  # ``import a.b`` binds ``a``
                        names[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names[node.name] = f"{module.name}.{node.name}"
                if isinstance(node, ast.ClassDef):
                    self.classes.add(f"{module.name}.{node.name}")
        return names

    def _target(self, dotted: str, depth: int = 0) -> str:
        """A dotted name re-exported by a package or imported into a module, to its definition."""
        if dotted in self.functions or dotted in self.classes or depth > 8:
            return dotted
        module, _, rest = dotted.rpartition(".")
        head = module
        while head and head not in self.found:
            head, _, more = head.rpartition(".")
            rest = f"{more}.{rest}"
        if head in self.found:
            first, _, tail = rest.partition(".")
            if first in self.names[head]:
                again = self.names[head][first] + (f".{tail}" if tail else "")
                if again != dotted:
                    return self._target(again, depth + 1)
        return dotted

    def _callee(self, func: Function, call: ast.Call, types: dict[str, str]) -> str | None:
        names = self.names[func.module]
        target = call.func
        if isinstance(target, ast.Name):
            if target.id in names:
                return self._target(names[target.id])
            return None
        if isinstance(target, ast.Attribute):
            chain = []
            node: ast.expr = target
            while isinstance(node, ast.Attribute):
                chain.append(node.attr)
                node = node.value
            if not isinstance(node, ast.Name):
                return None
            chain.reverse()
            if node.id in ("self", "cls") and "." in func.qualname:
                owner = func.qualname.rsplit(".", 1)[0]
                return f"{func.module}.{owner}." + ".".join(chain)
            if node.id in types:
                return self._target(types[node.id] + "." + ".".join(chain))
            if node.id in names:
                return self._target(names[node.id] + "." + ".".join(chain))
        return None

    def _annotated(self, func: Function) -> dict[str, str]:
        """Parameters annotated with a prunekit class (``X`` or ``X | None``)."""
        types = {}
        names = self.names[func.module]
        for arg in func.parameters():
            node = _annotation(arg.annotation)
            if isinstance(node, ast.BinOp):
                node = node.left
            if isinstance(node, ast.Name) and node.id in names:
                target = self._target(names[node.id])
                if target in self.classes:
                    types[arg.arg] = target
        return types

    def _carries(self, node: ast.expr, carried: set[Carried]) -> Carried | None:
        """What `node` hands on: the value itself (a Carried without field) or an object that
        holds it at a dotted path of attributes (a Carried with that `field`)."""
        direct = {c.name for c in carried if c.field is None}
        holders = {c.name: c.field for c in carried if c.field is not None}
        if isinstance(node, ast.Starred):
            node = node.value
        if isinstance(node, ast.Call):
            built = self._built(node, carried)
            if built is not None:
                return built
        for sub in _walk_values(node):
            if isinstance(sub, ast.Name) and sub.id in direct:
                return Carried("")
            if (  # holder.get("field", default): a mapping's field read
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr == "get"
                and isinstance(sub.func.value, ast.Name)
                and sub.func.value.id in holders
                and sub.args
                and isinstance(sub.args[0], ast.Constant)
                and sub.args[0].value == holders[sub.func.value.id]
            ):
                return Carried("")
            chain = _chain(sub)
            if chain is None or chain[0] not in holders:
                continue
            path, attrs = (holders[chain[0]] or "").split("."), chain[1:]
            if attrs[: len(path)] == path:
                return Carried("")
            if sub is node and path[: len(attrs)] == attrs:
                return Carried("", ".".join(path[len(attrs) :]))
            if (
                isinstance(sub, ast.Subscript)
                and isinstance(sub.value, ast.Name)
                and isinstance(sub.slice, ast.Constant)
                and [sub.slice.value] == path
            ):
                return Carried("")
        return None

    def _built(self, call: ast.Call, carried: set[Carried]) -> Carried | None:
        """An object a call makes that holds the value: a class built with it (a keyword or a
        field by position), a local function returning one (``checked()``), or a function
        that returns it or such an object."""
        target = call.func
        if isinstance(target, ast.Name) and target.id in self._closures:
            return self._closures[target.id]
        callee = self._current_callee(call)
        if callee in self.classes:
            fields = self._fields(callee)
            given = [(fields[i] if i < len(fields) else None, v) for i, v in enumerate(call.args)]
            given += [(k.arg, k.value) for k in call.keywords]
            for name, value in given:
                what = self._carries(value, carried)
                if what is None:
                    continue
                if name is None:  # **options, or past the fields
                    return what if what.field is not None else None
                return Carried("", name if what.field is None else f"{name}.{what.field}")
            return None
        function = self.functions.get(callee or "")
        if function is not None and self._depth < 6:
            received = self._received(function, call, carried)
            if received:
                return self._returns(function, received)
        return None

    def _fields(self, cls: str) -> list[str]:
        """A class's constructor parameters: its __init__'s, or a dataclass's fields."""
        init = self.functions.get(f"{cls}.__init__")
        if init is not None:
            return [p.arg for p in init.parameters()]
        module, _, name = cls.rpartition(".")
        for node in self.found[module].tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return [
                    n.target.id
                    for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                ]
        return []

    def _returns(self, func: Function, carried: set[Carried]) -> Carried | None:
        """What `func` returns of the value it receives in `carried`, if anything."""
        saved = (self._func, self._types, self._closures)
        self._func, self._types, self._closures = func, self._annotated(func), {}
        self._depth += 1
        try:
            carried = set(carried)
            for node in _in_order(func.node):
                if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                    self._assigned(func, node, carried, self._types)
                if isinstance(node, ast.Return) and node.value is not None:
                    found = self._carries(node.value, carried)
                    if found is not None:
                        return found
            return None
        finally:
            self._func, self._types, self._closures = saved
            self._depth -= 1

    def _current_callee(self, call: ast.Call) -> str | None:
        return self._callee(self._func, call, self._types) if self._func else None

    def _received(self, callee: Function, call: ast.Call, carried: set[Carried]) -> set[Carried]:
        """The callee's parameters that receive what the call hands on."""
        params = callee.parameters()
        a = callee.node.args
        positional = [*a.posonlyargs, *a.args][1 if callee.method else 0 :]
        got: set[Carried] = set()
        for i, arg in enumerate(call.args):
            what = self._carries(arg, carried)
            if what is None:
                continue
            if isinstance(arg, ast.Starred) and a.vararg is not None:
                got.add(Carried(a.vararg.arg, what.field))
            elif i < len(positional):
                got.add(Carried(positional[i].arg, what.field))
        named = {p.arg for p in params}
        for keyword in call.keywords:
            what = self._carries(keyword.value, carried)
            if what is None:
                continue
            if keyword.arg is None:  # **options: a holder of the same field
                if a.kwarg is not None:
                    got.add(Carried(a.kwarg.arg, what.field))
                for p in params:
                    if what.field is not None and p.arg == what.field:
                        got.add(Carried(p.arg))
            elif keyword.arg in named:
                got.add(Carried(keyword.arg, what.field))
            elif a.kwarg is not None:
                got.add(Carried(a.kwarg.arg, keyword.arg))
        return got

    def follow(self, entry: str, carried: set[Carried]) -> Flow:
        flow = Flow()
        entry = self._target(entry)  # where the public name is defined
        self._visit(self.functions[entry], carried, [_package(entry, self.found)], flow, set())
        return flow

    def _visit(
        self, func: Function, carried: set[Carried], chain: list[str], flow: Flow, seen: set[str]
    ) -> None:
        key = f"{func.where}:{sorted((c.name, c.field or '') for c in carried)}"
        if key in seen or len(chain) > 20:
            return
        seen.add(key)
        carried = set(carried)
        types = self._annotated(func)
        outer = self._closures
        self._func, self._types, self._closures = func, types, {}
        for inner in ast.iter_child_nodes(func.node):
            if isinstance(inner, ast.FunctionDef):
                for ret in ast.walk(inner):
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Call):
                        built = self._built(ret.value, carried)
                        if built is not None:
                            self._closures[inner.name] = built
        for node in _in_order(func.node):
            self._func, self._types = func, types
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                self._assigned(func, node, carried, types)
            if not isinstance(node, ast.Call):
                continue
            handed = [
                self._carries(x, carried) for x in [*node.args, *(k.value for k in node.keywords)]
            ]
            if not any(handed):
                continue
            callee = self._callee(func, node, types)
            if callee is None or callee.startswith(f"{PACKAGE}.core.errors."):
                continue  # an error's message names the value
            if callee in self.classes:
                callee = f"{callee}.__init__"
            target = self.functions.get(callee)
            if target is None:
                continue
            package = _package(callee, self.found)
            flow.calls.append((len(chain), func.where, callee))
            if package != chain[-1] and package in chain:
                flow.climbs.append(f"{func.where} -> {callee}")
            received = self._received(target, node, carried)
            closures = self._closures
            self._visit(target, received, [*chain, package], flow, seen)
            self._func, self._types, self._closures = func, types, closures
        self._closures = outer

    def _assigned(
        self, func: Function, node: ast.Assign | ast.AnnAssign, carried: set[Carried],
        types: dict[str, str],
    ) -> None:  # fmt: skip
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        value = node.value
        assert value is not None
        what = self._carries(value, carried)
        if what is None:
            return
        if isinstance(value, ast.Call):
            callee = self._callee(func, value, types)
            if callee in self.classes:
                for name in names:
                    types[name] = callee
            built = self._built(value, carried)
            if built is None and not _hands_on(value, lambda x: self._carries(x, carried)):
                return
            what = built or what
        elif not _hands_on(value, lambda x: self._carries(x, carried)):
            return
        for name in names:
            carried.add(Carried(name, what.field))


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"] (a Name, or Attributes over one)."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Subscript):
        return None
    return [node.id, *reversed(attrs)] if isinstance(node, ast.Name) else None


def _walk_values(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of an expression, but not inside an f-string (a message names the value,
    it does not hand it on)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.JoinedStr):
            yield from _walk_values(child)


def _hands_on(value: ast.expr, carries: Callable[[ast.expr], object]) -> bool:
    """Whether a name assigned `value` carries what `value` reads: the value itself, a part
    of it, an iteration over it, or a call that converts it (it is the first argument)."""
    if isinstance(value, ast.Call):
        return bool(value.args) and carries(value.args[0]) is not None
    if isinstance(value, ast.IfExp):
        return _hands_on(value.body, carries) or _hands_on(value.orelse, carries)
    return isinstance(
        value,
        ast.Name
        | ast.Attribute
        | ast.Subscript
        | ast.Starred
        | ast.ListComp
        | ast.GeneratorExp
        | ast.Tuple
        | ast.List
        | ast.BoolOp,
    )


def _in_order(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body in source order (nested functions left out)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        yield child
        yield from _in_order(child)


# (what, entry point, the names that carry it there)
FLOWS = [
    (
        "budget",
        "prunekit.structure.prune_channels",
        {Carried("budget"), Carried("options", "budget"), Carried("config", "budget")},
    ),
    ("calibration", "prunekit.prune_model", {Carried("calibration")}),
    (
        "method",
        "prunekit.prune_model",
        {Carried("method"), Carried("options", "method"), Carried("config", "method")},
    ),
]


def flows(found: dict[str, Module], every: list[Function]) -> list[tuple[str, Flow]]:
    follower = Follower(found, every)
    return [(what, follower.follow(entry, carried)) for what, entry, carried in FLOWS]


def report(verbose: bool) -> None:
    found = modules()
    between, inside = cycles(found)
    local = [(m.name, line, what) for m in found.values() for line, what in m.local_imports]
    own = [entry for entry in local if entry[2].startswith(PACKAGE)]
    every = functions(found)
    api = public_api()
    public = [f for f in every if f.where in api]
    named = [f for f in every if _is_public(f)]
    rows = [
        ("modules", len(found), []),
        ("package import cycles", len(between), [" <-> ".join(c) for c in between]),
        ("module import cycles inside one package", len(inside), [" <-> ".join(c) for c in inside]),
        ("function-local imports", len(local), [f"{m}:{line} {what}" for m, line, what in local]),
        ("  of prunekit modules", len(own), []),
        ("Any annotations (parameters and returns)", sum(f.any_annotations() for f in every), []),
        (
            "  in the public API",
            sum(f.any_annotations() for f in public),
            [f"{f.where}: {f.any_annotations()}" for f in public if f.any_annotations()],
        ),
        (
            f"public API functions with > {MAX_PARAMETERS} parameters",
            sum(f.count() > MAX_PARAMETERS for f in public),
            [f"{f.where}: {f.count()}" for f in public if f.count() > MAX_PARAMETERS],
        ),
        (
            f"  every public name with > {MAX_PARAMETERS} parameters",
            sum(f.count() > MAX_PARAMETERS for f in named),
            [f"{f.where}: {f.count()}" for f in named if f.count() > MAX_PARAMETERS],
        ),
        (
            f"functions longer than {MAX_LINES} lines",
            sum(f.lines() > MAX_LINES for f in every),
            [f"{f.where}: {f.lines()}" for f in every if f.lines() > MAX_LINES],
        ),
        ("registrations at import time", len(places := registrations(found)), places),
    ]
    for what, flow in flows(found, every):
        files = [_module_of(callee, found) for _, _, callee in flow.calls]
        calls = [f"{'  ' * depth}{callee}" for depth, _, callee in flow.calls]
        rows.append(
            (
                f"following {what}: packages / files / calls",
                f"{len(flow.packages(found))} / {len(set(files))} / {len(flow.calls)}",
                calls,
            )
        )
        rows.append(("  climbs back up", len(flow.climbs), flow.climbs))
    for label, count, details in rows:
        print(f"{label}: {count}")
        if verbose:
            for line in details:
                print(f"    {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="list what each count holds")
    parser.add_argument("--source", help="the src/ folder to read (default: this checkout's)")
    report(parser.parse_args().verbose)


if __name__ == "__main__":
    main()
