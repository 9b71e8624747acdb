"""The package's own imports: every module imports from the module that defines a name, never
from the `prunekit` package, so the package's __init__ may list its names in any order."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "prunekit"


def _imports_of_the_package(path: Path) -> list[str]:
    """The lines of `path` that import the package itself (not one of its modules)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name == "prunekit" for a in node.names):
            found.append(f"{path.relative_to(SRC)}:{node.lineno}")
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "prunekit":
            found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_no_module_imports_the_package_itself() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py"]
    assert len(modules) > 50
    found = [line for p in sorted(modules) for line in _imports_of_the_package(p)]
    assert found == []


# Each subpackage and top-level module imported first, under a bare `prunekit` package (its
# __init__ not run): one that needs a name of the package's __init__, or a module the
# __init__ happens to have imported before it (a cycle its order hides), fails here.
_EACH_ALONE = """
import importlib, pkgutil, sys, types
root = sys.argv[1] + "/prunekit"
names = [m.name for m in pkgutil.iter_modules([root], "prunekit.")]
failed = []
for name in names:
    if name == "prunekit.__main__":
        continue
    for key in [k for k in sys.modules if k == "prunekit" or k.startswith("prunekit.")]:
        del sys.modules[key]
    bare = types.ModuleType("prunekit")
    bare.__path__ = [root]
    sys.modules["prunekit"] = bare
    try:
        importlib.import_module(name)
    except Exception as error:
        failed.append(f"{name}: {error!r}")
print(len(names))
print("\\n".join(failed))
"""


def test_every_module_imports_without_the_package_init() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _EACH_ALONE, str(SRC)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    count, *failed = done.stdout.strip().split("\n")
    assert int(count) > 10
    assert [line for line in failed if line] == []
