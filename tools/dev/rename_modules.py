"""Give prunekit's modules names that say their job, and move the drop-in into one package.

Re-runnable and idempotent: run it from the repository's root on any checkout (before or after
other branches are merged); a module already moved is skipped, and every import of an old path
anywhere in the repository is rewritten by pattern:

    python tools/dev/rename_modules.py            # move and rewrite
    python tools/dev/rename_modules.py --check    # exit 1 if anything is left to do

What it does, for each (old, new) pair of MOVES:

- ``git mv`` the old file to the new path (a new package gets an ``__init__.py``);
- dotted paths: ``prunekit.old.path`` -> ``prunekit.new.path`` wherever it stands (imports,
  ``mock.patch`` strings, mkdocstrings' ``:::`` lines, import-linter contracts);
- file paths: ``src/prunekit/old/path.py``, ``prunekit/old/path.py`` and ``old/path.py``
  (a module inside a package) -> the new one;
- ``from parent import leaf [as alias]`` where ``parent.leaf`` moved: the new import, and,
  without an alias, ``leaf.`` -> ``newleaf.`` in that file;
- import-linter contracts with ``containers``: a layer named relative to the container;
- ``COMPAT`` modules (the old public paths users import) are written again as thin re-exports;
- ``SPLIT``: a module split into a package (or merged into another): its paths rewritten only;
- ``MOVED_NAMES``: ``from old import name`` pointed at the module that now defines the name;
- ``RENAMED_NAMES``: private functions of a split module that its package now exports.

At the end it runs ruff's import sorting and formatting on the files it changed.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

MOVES: list[tuple[str, str]] = [
    # three prune.py
    ("prunekit.structure.prune", "prunekit.structure.stages.entry"),
    ("prunekit.structure.depth.prune", "prunekit.structure.depth.block_pruning"),
    ("prunekit.distributed.prune", "prunekit.dropin.across_ranks"),
    # three layers.py
    ("prunekit.criteria.layers", "prunekit.calibrate.layer_matrices"),
    ("prunekit.criteria.weight_matrices", "prunekit.calibrate.layer_matrices"),
    ("prunekit.export.layers", "prunekit.export.layer_widths"),
    ("prunekit.export.streamed", "prunekit.export.streamed_shrink"),
    ("prunekit.structure.handlers.layers", "prunekit.structure.handlers.module_handlers"),
    # two of each
    ("prunekit.select.sources", "prunekit.select.inputs"),
    ("prunekit.tools.sources", "prunekit.tools.shrink_source"),
    ("prunekit.structure.saving.rebuild", "prunekit.structure.saving.shapes"),
    ("prunekit.structure.depth.rebuild", "prunekit.structure.depth.removal_checks"),
    ("prunekit.select.plan", "prunekit.select.strategy"),
    ("prunekit.whole.plan", "prunekit.whole.oneshot_plan"),
    ("prunekit.whole.calibrated", "prunekit.whole.oneshot_execute"),
    ("prunekit.export.hf", "prunekit.export.hf_folder"),
    ("prunekit.schedule.hf", "prunekit.schedule.hf_callback"),
    ("prunekit.select.group", "prunekit.select.process_group"),
    ("prunekit.distributed.group", "prunekit.distributed.collectives"),
    ("prunekit.export.companions", "prunekit.export.tokenizer_files"),
    ("prunekit.schedule.companions", "prunekit.schedule.companion_masks"),
    ("prunekit.structure.scoring.calibrated", "prunekit.structure.scoring.data_criteria"),
    ("prunekit.criteria.base", "prunekit.criteria.criterion"),
    ("prunekit.patterns.base", "prunekit.patterns.pattern"),
    ("prunekit.patterns.rowwise", "prunekit.patterns.tensorwise"),
    # the torch.nn.utils.prune drop-in, in one package
    ("prunekit.core.method", "prunekit.dropin.base_method"),
    ("prunekit.core.container", "prunekit.dropin.container"),
    ("prunekit.core.install", "prunekit.dropin.install"),
    ("prunekit.core.attention", "prunekit.dropin.out_proj"),
    ("prunekit.core.copying", "prunekit.dropin.copying"),
    ("prunekit.methods", "prunekit.dropin.torch_methods"),
    ("prunekit.functional", "prunekit.dropin.calls"),
]

PACKAGES = {
    "prunekit.calibrate": '"""The calibration runtime."""\n',
    "prunekit.dropin": (
        '"""The torch.nn.utils.prune drop-in.\n\n'
        "The method protocol and its container, installing masks on modules, the torch-named\n"
        "methods, and one call per method (also over a process group).\n"
        '"""\n'
    ),
}

# Modules split into a package whose __init__ re-exports their public names, or merged into
# another module: only the paths are rewritten (the split or merge itself is not a rename).
SPLIT = [
    ("prunekit.criteria.calibration", "prunekit.calibrate"),
    ("prunekit.dropin.container", "prunekit.dropin.base_method"),
]

# Names that moved to another module when the cycles were broken (the old module may still
# re-export them; an import of one is pointed at its new home): (old module, name, new module).
MOVED_NAMES = [
    ("prunekit.dropin.base_method", "TensorRef", "prunekit.core.naming"),
    ("prunekit.dropin.install", "pruning_hooks", "prunekit.dropin.hooks"),
    ("prunekit.dropin.install", "find_pruning_hook", "prunekit.dropin.hooks"),
    ("prunekit.dropin.install", "RefreshSubmodule", "prunekit.dropin.out_proj"),
    ("prunekit.distributed", "global_unstructured", "prunekit.dropin.across_ranks"),
]

# Private functions of a split module that its package now exports, in the files that import
# the package: (package, pattern, replacement).
RENAMED_NAMES = [
    ("prunekit.calibrate", r"(?<!\w)_batch_error\b", "batch_error"),
    ("prunekit.calibrate", r"\bcal\._features\b", "cal.input_features"),
]

# Old public paths kept importable: a thin module re-exporting the new one's public names.
COMPAT = {
    "prunekit.functional": "prunekit.dropin.calls",
    "prunekit.methods": "prunekit.dropin.torch_methods",
}
COMPAT_TEMPLATE = '''"""``{old}``: the old path of ``{new}``.

Kept for those who import it.
"""

from {new} import *  # noqa: F403
from {new} import __all__ as __all__
'''

# Text that names an old path on purpose (the deprecated alias tests read).
KEEP = re.compile(
    r"prunekit\.methods\.(METHODS|NOPE)\b|^import prunekit\.(functional|methods)\b.*$"
    r"|^# The old module paths.*$|prunekit\.tools \| prunekit\.functional \| prunekit\.methods",
    re.M,
)
SUFFIXES = {".py", ".pyi", ".md", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".c"}
SKIP = {Path(__file__).resolve()}


def _file(module: str) -> Path:
    return SRC.joinpath(*module.split(".")).with_suffix(".py")


def _git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True)


def move_files(dry: bool) -> list[str]:
    """git mv each old module that still stands where it was."""
    done = []
    for old, new in MOVES:
        source, target = _file(old), _file(new)
        if not source.exists() or target.exists():
            continue
        done.append(f"move {old} -> {new}")
        if dry:
            continue
        package = target.parent / "__init__.py"
        if not package.exists():
            package.parent.mkdir(parents=True, exist_ok=True)
            package.write_text(PACKAGES[new.rsplit(".", 1)[0]])
            _git("add", str(package))
        _git("mv", str(source), str(target))
    return done


def write_compat(dry: bool) -> list[str]:
    done = []
    for old, new in COMPAT.items():
        path = _file(old)
        if path.exists() or not _file(new).exists():
            continue
        done.append(f"compat {old}")
        if not dry:
            path.write_text(COMPAT_TEMPLATE.format(old=old, new=new))
            _git("add", str(path))
    return done


def _dotted(text: str) -> str:
    for old, new in MOVES + SPLIT:
        text = re.sub(rf"(?<![\w.]){re.escape(old)}(?![\w])", new, text)
    return text


def _paths(text: str) -> str:
    for old, new in MOVES:
        old_rel, new_rel = old.split(".")[1:], new.split(".")[1:]
        before, after = "/".join(old_rel) + ".py", "/".join(new_rel) + ".py"
        # a top-level module only with its package in front; a nested one also bare
        prefix = r"((?:src/)?prunekit/)" if len(old_rel) == 1 else r"((?:src/)?(?:prunekit/)?)"
        text = re.sub(rf"(?<![\w/.]){prefix}{re.escape(before)}\b", rf"\g<1>{after}", text)
    return text


_FROM = re.compile(
    r"^(?P<indent>[ \t]*)from (?P<parent>prunekit(?:\.\w+)*) import "
    r"(?:\((?P<many>[^)]*)\)|(?P<one>[^\n#]*?))(?P<comment>[ \t]*#[^\n]*)?$",
    re.M,
)


def _leaf_imports(text: str) -> str:
    """``from parent import leaf`` where parent.leaf moved."""
    moved = dict(MOVES + SPLIT)
    renames: list[tuple[str, str]] = []

    def fix(match: re.Match[str]) -> str:
        parent, indent = match["parent"], match["indent"]
        names = [n.strip() for n in (match["many"] or match["one"]).split(",") if n.strip()]
        kept, extra = [], []
        for item in names:
            name, _, alias = (p.strip() for p in item.partition(" as "))
            new = moved.get(f"{parent}.{name}")
            if new is None:
                kept.append(item)
                continue
            new_parent, new_leaf = new.rsplit(".", 1)
            if not alias and new_leaf != name:
                renames.append((name, new_leaf))
            local = alias or new_leaf
            if new_parent == "prunekit":
                extra.append(f"{indent}import {new} as {local}")
            elif new_parent == parent:
                kept.append(new_leaf if local == new_leaf else f"{new_leaf} as {local}")
            else:
                tail = "" if local == new_leaf else f" as {local}"
                extra.append(f"{indent}from {new_parent} import {new_leaf}{tail}")
        if not extra and len(kept) == len(names) and kept == names:
            return match[0]
        lines = [f"{indent}from {parent} import {', '.join(kept)}"] if kept else []
        if lines and match["comment"]:
            lines[0] += match["comment"]
        return "\n".join(lines + extra)

    text = _FROM.sub(fix, text)
    for old, new in renames:
        text = _rename_name(text, old, new)
    return text


def _rename_name(text: str, old: str, new: str) -> str:
    """Every use of the name `old` in Python code (not an attribute, keyword or string)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):  # Markdown: the attribute form only
        return re.sub(rf"(?<![\w.]){re.escape(old)}\.(?=\w)", f"{new}.", text)
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    spans = []
    for i, token in enumerate(tokens):
        if token.type != tokenize.NAME or token.string != old:
            continue
        before = tokens[i - 1].string if i else ""
        after = tokens[i + 1].string if i + 1 < len(tokens) else ""
        if before == "." or after == "=" or before in ("def", "class"):
            continue
        row, col = token.start
        spans.append(starts[row - 1] + col)
    for at in reversed(spans):
        text = text[:at] + new + text[at + len(old) :]
    return text


def _contracts(text: str) -> str:
    """Layers named relative to a container in pyproject's import-linter contracts."""
    blocks = re.split(r"(?m)^(?=\[\[tool\.importlinter\.contracts\]\])", text)
    out = []
    for block in blocks:
        found = re.search(r'containers = \["([\w.]+)"\]', block)
        if found:
            container = found[1]
            for old, new in MOVES:
                if old.rsplit(".", 1)[0] != container or new.rsplit(".", 1)[0] != container:
                    continue
                a, b = old.rsplit(".", 1)[1], new.rsplit(".", 1)[1]
                head, _, layers = block.partition("layers = [")
                layers = re.sub(rf"(?<![\w.]){a}(?![\w.])", b, layers)
                block = f"{head}layers = [{layers}" if _ else block
        out.append(block)
    return "".join(out)


def _moved_names(text: str) -> str:
    """``from old import name`` -> ``from new import name`` for the names of MOVED_NAMES."""
    homes = {(old, name): new for old, name, new in MOVED_NAMES}

    def fix(match: re.Match[str]) -> str:
        parent, indent = match["parent"], match["indent"]
        names = [n.strip() for n in (match["many"] or match["one"]).split(",") if n.strip()]
        kept, extra = [], []
        for item in names:
            new = homes.get((parent, item.partition(" as ")[0].strip()))
            if new is None:
                kept.append(item)
            else:
                extra.append(f"{indent}from {new} import {item}")
        if not extra:
            return match[0]
        lines = [f"{indent}from {parent} import {', '.join(kept)}"] if kept else []
        if lines and match["comment"]:
            lines[0] += match["comment"]
        return "\n".join(lines + extra)

    text = _FROM.sub(fix, text)
    for package, pattern, new in RENAMED_NAMES:
        if package in text:
            text = re.sub(pattern, new, text)
    return text


def rewrite(text: str, path: Path) -> str:
    kept: list[str] = []

    def hide(match: re.Match[str]) -> str:
        kept.append(match[0])
        return f"\x00{len(kept) - 1}\x00"

    text = KEEP.sub(hide, text)
    if path.suffix in (".py", ".pyi", ".md"):
        text = _leaf_imports(text)
    text = _dotted(text)
    if path.suffix in (".py", ".pyi"):
        text = _moved_names(text)
    text = _paths(text)
    if path.name == "pyproject.toml":
        text = _contracts(text)
    return re.sub("\x00(\\d+)\x00", lambda m: kept[int(m[1])], text)


def files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    compat = {_file(old).resolve() for old in COMPAT}
    found = []
    for name in listed:
        path = (ROOT / name).resolve()
        if path in SKIP or path in compat or not path.is_file():
            continue
        if path.suffix in SUFFIXES or path.name == "Makefile":
            found.append(path)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if due")
    dry = parser.parse_args().check
    todo = move_files(dry)
    changed = []
    for path in files():
        text = path.read_text()
        new = rewrite(text, path)
        if new != text:
            changed.append(path)
            if not dry:
                path.write_text(new)
    todo += write_compat(dry)
    todo += [f"rewrite {p.relative_to(ROOT)}" for p in changed]
    print("\n".join(todo) or "nothing to do")
    python = [str(p) for p in changed if p.suffix == ".py"]
    if python and not dry:
        ruff = [sys.executable, "-m", "ruff"]
        subprocess.run([*ruff, "check", "-q", "--select", "I", "--fix", *python], cwd=ROOT)
        subprocess.run([*ruff, "format", "-q", *python], cwd=ROOT)
    return 1 if dry and todo else 0


if __name__ == "__main__":
    sys.exit(main())
