"""Runs PyTorch's own pruning tests (test_pruning.py beside this file) against prunekit.

``python tests/peer/run.py`` maps ``torch.nn.utils.prune`` to prunekit (in ``sys.modules``
and as the attribute of ``torch.nn.utils``, so the file's import, its ``mock.patch``
targets and its ``torch.nn.utils.prune.X`` references all reach prunekit), checks that
the mapping took effect, then runs every test of the file. The tests in EXCLUDED check
a detail of torch's own implementation that no drop-in can match; they run too, and
must fail (a test that starts passing is reported, so the list stays honest).
``--against torch`` runs the file unchanged on torch itself: every test must pass, which
shows the copy is intact. Prints ``peer (...): N passed, N failed, N skipped`` and exits
non-zero on any failure.
"""

from __future__ import annotations

import argparse
import importlib.util
import pkgutil
import sys
import unittest
from pathlib import Path
from types import ModuleType

PEER_FILE = Path(__file__).with_name("test_pruning.py")

EXCLUDED: dict[str, str] = {}
"""Test name -> why no drop-in can pass it (also listed in the README)."""


def map_prune_to(target: ModuleType) -> None:
    """Make ``torch.nn.utils.prune`` (import, attribute and mock.patch paths) be `target`."""
    import torch.nn.utils

    sys.modules["torch.nn.utils.prune"] = target
    torch.nn.utils.prune = target  # type: ignore[attr-defined]


def load_peer_module() -> ModuleType:
    """Import the peer file under a name of its own (not __main__: run_tests stays idle)."""
    spec = importlib.util.spec_from_file_location("peer_test_pruning", PEER_FILE)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {PEER_FILE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def check_mapping(peer: ModuleType, expected: ModuleType) -> None:
    """Fail loudly unless every way the file reaches the prune module gives `expected`."""
    import torch
    from torch import nn

    problems = []
    if peer.prune is not expected:
        problems.append(f"the file's `prune` is {peer.prune.__name__}")
    if torch.nn.utils.prune is not expected:
        problems.append("torch.nn.utils.prune (attribute) is another module")
    for name in ("L1Unstructured", "RandomUnstructured", "PruningContainer"):
        found = pkgutil.resolve_name(f"torch.nn.utils.prune.{name}")  # what mock.patch reads
        if found is not getattr(expected, name):
            problems.append(f"mock.patch would resolve {name} to {found!r}")
    layer = nn.Linear(3, 2)
    peer.prune.l1_unstructured(layer, "weight", amount=1)
    hook = next(iter(layer._forward_pre_hooks.values()))
    if not type(hook).__module__.startswith(expected.__name__):
        problems.append(f"pruning installs {type(hook).__module__}.{type(hook).__name__}")
    if problems:
        raise SystemExit("the mapping did not take effect: " + "; ".join(problems))


def mark_excluded(case: type[unittest.TestCase]) -> None:
    """Run each excluded test as an expected failure."""
    for name in EXCLUDED:
        if not hasattr(case, name):
            raise SystemExit(f"EXCLUDED names {name!r}, which the peer file does not define")
        setattr(case, name, unittest.expectedFailure(getattr(case, name)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", choices=("prunekit", "torch"), default="prunekit")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    sys.argv = sys.argv[:1]  # torch's test helpers read the command line too

    if args.against == "prunekit":
        import prunekit

        map_prune_to(prunekit)
        expected = prunekit
    else:
        import torch.nn.utils.prune

        expected = torch.nn.utils.prune
    peer = load_peer_module()
    check_mapping(peer, expected)
    if args.against == "prunekit":
        mark_excluded(peer.TestPruningNN)

    suite = unittest.defaultTestLoader.loadTestsFromModule(peer)
    runner = unittest.TextTestRunner(verbosity=2 if args.verbose else 1, stream=sys.stdout)
    result = runner.run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    excluded = len(result.expectedFailures)
    passed = result.testsRun - failed - excluded - len(result.skipped)
    for test in result.unexpectedSuccesses:
        print(f"excluded but passed (take it off EXCLUDED): {test.id()}")
    print(f"excluded, failing as expected: {excluded}")
    print(f"peer ({args.against}): {passed} passed, {failed} failed, {len(result.skipped)} skipped")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
