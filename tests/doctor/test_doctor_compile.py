"""The doctor and the kernel compile on CPU: the cache probe ignores gdnctl's own compile log, and a machine that
cannot run FlashQLA gets neither an estimate nor a log."""

from __future__ import annotations

import os
import subprocess
import sys

from gdnctl.doctor.probes import gather
from gdnctl.runtime.kernels import COMPILE_LOG_NAME


def test_a_cache_holding_only_the_compile_log_is_empty(tmp_path):
    (tmp_path / COMPILE_LOG_NAME).write_text("===== an earlier run =====\n")
    assert gather(str(tmp_path)).kernel_cache.entries == 0
    (tmp_path / "kernel_lib.so").write_bytes(b"")
    assert gather(str(tmp_path)).kernel_cache.entries == 1


def test_kernels_without_a_gpu_say_no_estimate_and_write_no_log(tmp_path):
    env = {**os.environ, "TILELANG_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "gdnctl", "doctor", "tiny-qwen3.5-sft", "--kernels"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert "SKIP  kernels" in proc.stdout and "Traceback" not in proc.stderr
    assert "FlashQLA kernels for" not in proc.stdout + proc.stderr
    assert not (tmp_path / COMPILE_LOG_NAME).exists()
