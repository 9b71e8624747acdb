"""_native.c is plain C99: every C compiler found here builds it without a warning, and each
build selects what the installed one does (with or without target_clones and ctz)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest
import torch

from prunekit import select

SOURCE = Path(select.__file__).parent / "_native.c"
# GCC and Clang 14+ build the AVX-512/AVX2 clones; Clang 13 and TCC have no target_clones,
# TCC no __builtin_ctzll either.
COMPILERS = ["cc", "gcc", "clang", "clang-13", "clang-14", "tcc"]
STRICT = ["-pedantic-errors", "-Wextra"]  # GCC's and Clang's, beyond TCC's


def build(compiler: str, out: Path) -> ModuleType:
    """_native.c built by `compiler` as C99, warnings as errors, and loaded."""
    flags = ["-std=c99", "-O1", "-fPIC", "-shared", "-Wall", "-Werror"]
    if compiler != "tcc":
        flags += STRICT
    include = sysconfig.get_paths()["include"]
    command = [compiler, *flags, f"-I{include}", str(SOURCE), "-o", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    spec = importlib.util.spec_from_file_location("_native", out)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_pass(native: ModuleType, scores: torch.Tensor, alive: torch.Tensor) -> tuple:
    """split, kth and settle over one chunk: the counts, the mask and the k-th value."""
    n = scores.numel()
    out = torch.full((n,), 7, dtype=torch.float32)
    positions = torch.empty(n, dtype=torch.int64)
    values = torch.empty(n, dtype=scores.dtype)
    one = 0x3F800000  # the bits of 1.0 as float32: a mask, 0 where chosen
    size = scores.element_size()
    tally = native.split(
        scores.data_ptr(), size, alive.data_ptr(), 1, 1, out.data_ptr(), 4, 0, one, 0, 0, n,
        0.2, 0.25, 0.3, positions.data_ptr(), values.data_ptr(), 0,
    )  # fmt: skip
    found = tally[1]
    kth = native.kth(values.data_ptr(), size, found, found // 2)
    left = native.settle(
        out.data_ptr(), 4, 0, one, 0, 0, positions.data_ptr(), values.data_ptr(), size, found,
        kth, 0.25, 3,
    )  # fmt: skip
    return tally, kth, left, out, positions[:found].clone()


@pytest.mark.skipif(select._native is None, reason="the C loop is not built")
@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_builds_and_selects_as_installed(compiler: str, dtype: torch.dtype, tmp_path: Path) -> None:
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed")
    built = build(compiler, tmp_path / f"_native_{compiler}.so")
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(30_001, generator=g, dtype=torch.float64).to(dtype)
    scores[::97] = 0.25  # ties at the guess
    alive = torch.rand(30_001, generator=g) < 0.8
    got = one_pass(built, scores, alive)
    want = one_pass(select._native, scores, alive)
    assert got[:3] == want[:3]
    assert torch.equal(got[3], want[3]) and torch.equal(got[4], want[4])
    # Gathered in order, as the ties' order needs: every flag in between, none else.
    magnitudes = scores.abs()
    between = alive & (magnitudes >= 0.2) & (magnitudes <= 0.3)
    assert torch.equal(got[4], between.nonzero().reshape(-1))
