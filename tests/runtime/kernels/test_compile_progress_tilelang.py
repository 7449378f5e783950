"""The per-kernel progress hook against the real TileLang, on CPU: TileLang compiles small kernels for its C
target (a C compiler is all it needs), which goes through the same `JITKernel` and disk cache as FlashQLA's CUDA
kernels. Skipped where tilelang is not installed; the GPU suite (tests/doctor/test_compile_progress_gpu.py)
checks FlashQLA itself.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gdnctl.runtime.kernels import COMPILE_LOG_NAME

pytest.importorskip("tilelang", reason="needs tilelang")

# TileLang reads a kernel's Python source, so the child runs a file, not `python -c`. The inner functions are
# named the way FlashQLA names its kernels (tilelang_<name>_kernel).
SCRIPT = """
import tilelang
import tilelang.language as T
from gdnctl.runtime.kernels import compile_quietly, watch_compiles


@tilelang.jit(target="c")
def add_one(N):
    @T.prim_func
    def tilelang_add_one_kernel(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(1) as (bx,):
            for i in T.serial(N):
                B[i] = A[i] + 1.0
    return tilelang_add_one_kernel


@tilelang.jit(target="c")
def add_two(N):
    @T.prim_func
    def tilelang_add_two_kernel(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(1) as (bx,):
            for i in T.serial(N):
                B[i] = A[i] + 2.0
    return tilelang_add_two_kernel


with compile_quietly(["cpu-shape"], print, header="tilelang cpu test") as say:
    with watch_compiles("cpu-shape", 2, say):
        add_one(16)
        add_two(16)
"""


def compile_kernels(cache_dir) -> subprocess.CompletedProcess:
    script = cache_dir.parent / "compile_two_kernels.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TILELANG_CACHE_DIR": str(cache_dir)},
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_a_cold_cache_gives_a_line_per_kernel_and_keeps_tilelang_in_the_log(tmp_path):
    lines = compile_kernels(tmp_path / "cache").stdout.splitlines()
    assert "to compile into the empty kernel cache" in lines[0]
    assert lines[1] == f"compiler output goes to {tmp_path / 'cache' / COMPILE_LOG_NAME}"
    assert [line.rsplit(",", 1)[0] for line in lines[2:4]] == [
        "compiling FlashQLA kernels for cpu-shape: 1/2 add_one",
        "compiling FlashQLA kernels for cpu-shape: 2/2 add_two",
    ]
    assert lines[4].startswith("FlashQLA kernels for cpu-shape ready in") and lines[4].endswith("(2 compiled)")
    assert len(lines) == 5
    log = (tmp_path / "cache" / COMPILE_LOG_NAME).read_text()
    assert "TileLang begins to compile kernel `tilelang_add_two_kernel`" in log


def test_a_warm_cache_loads_without_compiling(tmp_path):
    compile_kernels(tmp_path / "cache")
    lines = compile_kernels(tmp_path / "cache").stdout.splitlines()
    assert "the kernel cache" in lines[0] and "holds" in lines[0]
    assert not any(line.startswith("compiling") for line in lines)
    assert lines[-1].startswith("FlashQLA kernels for cpu-shape ready in") and "compiled" not in lines[-1]
