"""Pruning from several threads at once, and in a process forked after pruning.

The selection's C loop splits each chunk among a pool of threads (as many as torch has);
these tests go through the public API only, on tensors large enough for that path.

A forked child sets torch to one thread before it prunes, as torch's DataLoader workers
do: torch's own OpenMP runtime (libgomp) is not fork-safe, so in a child of a process that
ran parallel torch operations, any parallel torch operation waits forever (plain torch
does it too: ``x.abs().sum()`` on 4M entries; GCC bug 60035, pytorch#17199).
"""

from __future__ import annotations

import faulthandler
import hashlib
import multiprocessing
import threading
from collections.abc import Callable

import pytest
import torch
from torch import nn

import prunekit as prune

ROUNDS = 2


pytestmark = pytest.mark.usefixtures("two_torch_threads")


def model(seed: int) -> nn.Sequential:
    """Two layers of 2**20 weights each: several chunks, each split in parts.

    Its values come from a generator of its own, not torch.manual_seed (see
    test_fork_while_another_thread_prunes).
    """
    g = torch.Generator().manual_seed(seed)
    m = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return m


def digest(m: nn.Module) -> str:
    """The masks of `m`, hashed."""
    h = hashlib.sha256()
    for key, value in m.state_dict().items():
        if key.endswith("_mask"):
            h.update(key.encode() + value.numpy().tobytes())
    return h.hexdigest()


def work(m: nn.Sequential) -> str:
    """Rounds of every kind of selection: one tensor, again (a container), global, channels."""
    for _ in range(ROUNDS):
        prune.l1_unstructured(m[0], "weight", 0.3)
        prune.global_unstructured(
            [(m[0], "weight"), (m[2], "weight")], prune.L1Unstructured, amount=0.2
        )
        prune.ln_structured(m[2], "weight", 0.1, n=2, dim=0)
    prune.prune_model(m, 0.1, scope="global")
    return digest(m)


def run_in_threads(jobs: list[Callable[[], str]]) -> list[str]:
    """Run each job in its own thread, all started together; their results in order."""
    results: list[str | BaseException] = [""] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = jobs[i]()
        except BaseException as error:
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), "a pruning thread never finished (deadlock?)"
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [str(r) for r in results]


def test_two_threads_pruning_two_models_get_the_masks_of_one_thread() -> None:
    expected = [work(model(1)), work(model(2))]
    assert expected[0] != expected[1]
    for _ in range(2):
        models = [model(1), model(2)]
        jobs = [lambda m=m: work(m) for m in models]  # type: ignore[misc]
        assert run_in_threads(jobs) == expected


def test_threads_pruning_while_others_run_forward_passes() -> None:
    shared = model(3)
    prune.prune_model(shared, 0.5)
    x = torch.randn(4, 1024)
    with torch.no_grad():
        reference = shared(x)
    expected = work(model(4))

    def forwards() -> str:
        with torch.no_grad():
            for _ in range(20):
                assert torch.equal(shared(x), reference)
        return "ok"

    assert run_in_threads([forwards, lambda: work(model(4)), forwards]) == [
        "ok",
        expected,
        "ok",
    ]


def child(conn: object, seed: int) -> None:
    """In the forked process: prune a fresh model, send back its masks' digest."""
    faulthandler.dump_traceback_later(120, exit=True)  # a hang: its stack, then exit
    torch.set_num_threads(1)  # see the module's docstring
    conn.send(work(model(seed)))  # type: ignore[attr-defined]


def test_fork_after_pruning() -> None:
    expected = work(model(5))  # the pool's threads exist now, in this process
    context = multiprocessing.get_context("fork")
    for _ in range(2):
        ours, theirs = context.Pipe()
        process = context.Process(target=child, args=(theirs, 5))
        process.start()
        process.join(timeout=200)
        if process.is_alive():
            process.kill()
            pytest.fail("the forked process never finished pruning (deadlock after fork?)")
        assert process.exitcode == 0
        assert ours.recv() == expected
    assert work(model(5)) == expected  # and the parent still prunes


def test_fork_while_another_thread_prunes() -> None:
    """A fork can come at any time: the child's pool starts afresh.

    Only the pruning runs beside the fork: a lock that torch takes (its default generator's,
    making a layer; torch.cuda's lazy seeding, in manual_seed) and another thread holds at
    the fork stays taken in the child, which then waits forever (torch's, not prunekit's).
    """
    expected = work(model(6))
    other = model(7)  # made here: making one draws from torch's generator, under its lock
    busy = threading.Thread(target=lambda: work(other))
    busy.start()
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    process = context.Process(target=child, args=(theirs, 6))
    process.start()
    process.join(timeout=300)
    busy.join(timeout=300)
    if process.is_alive():
        process.kill()
        pytest.fail("the forked process never finished pruning (deadlock after fork?)")
    assert process.exitcode == 0 and ours.recv() == expected
