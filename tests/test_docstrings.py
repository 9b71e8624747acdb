"""Every public name says in its docstring what its signature cannot: the reference is made of them.

The names: ``prunekit.__all__`` and every entry a page of docs/reference/ documents
(``::: prunekit.export.export``). The docstrings are read as the site reads them (griffe, Google
style, from the source without importing it), and:

- a function documents each of its parameters under Args (and no other), has a Returns (or
  Yields) section exactly when its annotation says it returns something, and a Raises section
  when its body raises;
- a class documents each parameter of its constructor (a dataclass: its fields) under Args or
  Attributes, has at least one of the two when it takes parameters or has public attributes of
  its own, and a Raises section when its constructor raises;
- an attribute (an alias, a constant) has a docstring;
- a public method of such a class is a function as above, unless a base class defines it
  (documented there: ``Identity.apply`` is ``BasePruningMethod.apply``) or the class derives
  from another library's class (a Trainer's or Lightning's hooks, documented by them).
"""

from __future__ import annotations

import ast
import re
import textwrap
from functools import cache
from pathlib import Path

import griffe
import pytest

import prunekit

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"

_DIRECTIVE = re.compile(r"^::: (prunekit(?:\.\w+)+)\s*$", re.M)
_ARGS = {griffe.DocstringSectionKind.parameters, griffe.DocstringSectionKind.other_parameters}
_RETURNS = {griffe.DocstringSectionKind.returns, griffe.DocstringSectionKind.yields}


@cache
def _package() -> griffe.Module:
    loaded = griffe.load(
        "prunekit",
        search_paths=[str(ROOT / "src")],
        docstring_parser="google",
        resolve_aliases=False,
    )
    assert isinstance(loaded, griffe.Module)
    return loaded


def public_names() -> list[str]:
    """The dotted names the tests check: prunekit.__all__, then the reference's other entries."""
    names = [f"prunekit.{name}" for name in prunekit.__all__ if name != "__version__"]
    for page in sorted(REFERENCE.glob("*.md")):
        for name in _DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            if name not in names:
                names.append(name)
    return names


def resolve(dotted: str) -> griffe.Object:
    """The object a dotted public name stands for, followed through imports.

    ``prunekit.report`` is both a module and, in ``prunekit.__all__``, the function of that
    module that ``prunekit/__init__.py`` imports over it: the function is meant.
    """
    found: griffe.Object | griffe.Alias = _package()[dotted.removeprefix("prunekit.")]
    if isinstance(found, griffe.Alias):
        found = found.final_target
    if isinstance(found, griffe.Module) and found.name in found.members:
        return resolve(f"{found.path}.{found.name}")
    assert isinstance(found, griffe.Object)
    return found


def _sections(obj: griffe.Object) -> list[griffe.DocstringSection]:
    return list(obj.docstring.parsed) if obj.docstring is not None else []


def _documented(sections: list[griffe.DocstringSection], kinds: set[str]) -> list[str]:
    names: list[str] = []
    for section in sections:
        if section.kind in kinds:
            names += [item.name.lstrip("*") for item in section.value]
    return names


def _raises(function: griffe.Function) -> bool:
    """Whether the function's own body holds a ``raise`` of an exception (a bare re-raise aside)."""
    if not function.source:  # a dataclass's generated __init__
        return False
    definition = ast.parse(textwrap.dedent(function.source)).body[0]
    assert isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef)
    stack: list[ast.AST] = list(definition.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue  # a nested definition raises when it runs, not when this function does
        if isinstance(node, ast.Raise) and node.exc is not None:
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _returns_something(function: griffe.Function) -> bool:
    return function.returns is not None and str(function.returns) not in {"None", "NoReturn"}


def function_problems(function: griffe.Function) -> list[str]:
    """What the function's docstring lacks (or has wrongly), as sentences."""
    sections = _sections(function)
    kinds = {section.kind for section in sections}
    problems: list[str] = []
    wanted = [p.name for p in function.parameters if p.name not in {"self", "cls"}]
    documented = _documented(sections, _ARGS)
    if wanted and not kinds & _ARGS:
        problems.append("no Args section")
    if missing := [name for name in wanted if name not in documented]:
        problems.append(f"parameters missing from Args: {missing}")
    if extra := [name for name in documented if name not in wanted]:
        problems.append(f"Args names what the signature has not: {extra}")
    if _returns_something(function) and not kinds & _RETURNS:
        problems.append(f"returns {function.returns} but has no Returns section")
    if not _returns_something(function) and griffe.DocstringSectionKind.returns in kinds:
        problems.append("returns nothing but has a Returns section")
    if _raises(function) and griffe.DocstringSectionKind.raises not in kinds:
        problems.append("raises but has no Raises section")
    return problems


def class_problems(cls: griffe.Class) -> list[str]:
    """What the class's docstring (with its constructor's) lacks, as sentences."""
    sections = _sections(cls)
    constructors = [
        member
        for name in ("__init__", "__post_init__")
        if isinstance(member := cls.all_members.get(name), griffe.Function)
    ]
    if isinstance(init := cls.members.get("__init__"), griffe.Function):
        sections += _sections(init)
    kinds = {section.kind for section in sections}
    problems: list[str] = []
    described = _ARGS | {griffe.DocstringSectionKind.attributes}
    wanted = [p.name for p in cls.parameters if p.name not in {"self", "cls"}]
    attributes = [
        name
        for name, member in cls.members.items()
        if member.is_attribute and not name.startswith("_") and name not in wanted
    ]
    if (wanted or attributes) and not kinds & described:
        problems.append("neither an Args nor an Attributes section")
    documented = _documented(sections, described)
    if missing := [name for name in wanted if name not in documented]:
        problems.append(f"constructor parameters missing from Args/Attributes: {missing}")
    if extra := [name for name in _documented(sections, _ARGS) if name not in wanted]:
        problems.append(f"Args names what the constructor has not: {extra}")
    own = [f for f in constructors if f.parent is cls]
    if any(_raises(f) for f in own) and griffe.DocstringSectionKind.raises not in kinds:
        problems.append("its constructor raises but there is no Raises section")
    return problems


# bases from the standard library that define no methods a subclass overrides in prunekit
_PLAIN_BASES = {"ABC", "object", "Exception", "RuntimeError", "ValueError", "TypeError"}


def public_methods(cls: griffe.Class) -> list[griffe.Function]:
    """The methods of `cls` its own docstrings must document (see the module's docstring)."""
    external = [b for b in cls.bases if str(b).split("[")[0] not in _PLAIN_BASES]
    if len(external) > len(cls.resolved_bases):  # another library's class: its hooks
        return []
    inherited = {name for base in cls.mro() for name in base.members}
    return [
        member
        for name, member in cls.members.items()
        if isinstance(member, griffe.Function)
        and not name.startswith("_")
        and "property" not in member.labels
        and name not in inherited
    ]


def problems_of(dotted: str) -> list[str]:
    """What the public name's docstring lacks; [] when it has all it should."""
    obj = resolve(dotted)
    if obj.docstring is None or not obj.docstring.value.strip():
        return ["no docstring"]
    if isinstance(obj, griffe.Function):
        return function_problems(obj)
    if isinstance(obj, griffe.Class):
        problems = class_problems(obj)
        for method in public_methods(obj):
            if method.docstring is None:
                problems.append(f"{method.name}: no docstring")
            else:
                problems += [f"{method.name}: {problem}" for problem in function_problems(method)]
        return problems
    return []


def test_names_found() -> None:
    names = public_names()
    assert "prunekit.prune_model" in names
    assert "prunekit.export.export" in names
    assert len(names) == len(set(names))


@pytest.mark.parametrize("dotted", public_names())
def test_public_docstring(dotted: str) -> None:
    problems = problems_of(dotted)
    where = resolve(dotted)
    assert problems == [], f"{dotted} ({where.relative_filepath}:{where.lineno}): {problems}"


def test_report_is_the_function() -> None:
    assert isinstance(resolve("prunekit.report"), griffe.Function)


def test_the_checks_see_what_lacks() -> None:
    """The checks fail where they should: on a sample module rather than on prunekit."""
    source = '''
    def bare(x: int, *, y: str = "") -> int:
        """Something."""
        if x < 0:
            raise ValueError(x)
        return x

    def full(x: int, **options: int) -> None:
        """Something.

        Args:
            x: a number.
            **options: more.
            z: not a parameter.

        Returns:
            nothing at all.
        """

    class Holder:
        """A thing."""

        def __init__(self, size: int) -> None:
            if size < 0:
                raise ValueError(size)
            self.size = size
    '''
    with griffe.temporary_visited_module(
        textwrap.dedent(source), docstring_parser="google"
    ) as module:
        bare, full, holder = module["bare"], module["full"], module["Holder"]
    assert isinstance(bare, griffe.Function)
    assert function_problems(bare) == [
        "no Args section",
        "parameters missing from Args: ['x', 'y']",
        "returns int but has no Returns section",
        "raises but has no Raises section",
    ]
    assert isinstance(full, griffe.Function)
    assert function_problems(full) == [
        "Args names what the signature has not: ['z']",
        "returns nothing but has a Returns section",
    ]
    assert isinstance(holder, griffe.Class)
    assert class_problems(holder) == [
        "neither an Args nor an Attributes section",
        "constructor parameters missing from Args/Attributes: ['size']",
        "its constructor raises but there is no Raises section",
    ]
