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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src"
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
    for label, count, details in rows:
        print(f"{label}: {count}")
        if verbose:
            for line in details:
                print(f"    {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="list what each count holds")
    report(parser.parse_args().verbose)


if __name__ == "__main__":
    main()
