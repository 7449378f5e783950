"""`gdnctl prewarm` and `gdnctl doctor --kernels --bench` against the real TileLang and FlashQLA: an estimate
first, a line per kernel while TileLang compiles, and none of TileLang's own output on the console.

This is where the per-kernel hook (TileLang's "begins to compile kernel" log record, read by
gdnctl/runtime/kernels/compile_progress.py) is checked against the installed TileLang: a cold cache must
produce per-kernel lines. The first test compiles from an empty cache (minutes per shape), the second reuses it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from gdnctl.runtime.kernels import COMPILE_LOG_NAME

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PRESET = "tiny-qwen3.5-sft"
SHAPE = "tp1-1x1024"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tilelang-cache")


def assert_no_compile_chatter(text: str) -> None:
    """TileLang's per-kernel INFO lines (hundreds in a cold compile) belong in the log, not on the console."""
    assert "TileLang begins to compile" not in text and "TileLang completes to compile" not in text


def gdnctl(*args: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name != "TILELANG_CACHE_DIR"}
    return subprocess.run(
        [sys.executable, "-m", "gdnctl", *args], capture_output=True, text=True, timeout=3600, env=env
    )


@pytest.mark.xdist_group("compile-progress")  # the second test reads the cache the first compiled (pytest -n)
def test_prewarm_from_a_cold_cache_says_each_kernel_and_keeps_tilelang_in_the_log(cache_dir):
    proc = gdnctl("prewarm", PRESET, "--cache-dir", str(cache_dir), "--no-verify")
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    estimate = next(i for i, line in enumerate(lines) if line.startswith("FlashQLA kernels for 2 kernel shapes"))
    assert f"to compile into the empty kernel cache {cache_dir}:" in lines[estimate]
    assert lines[estimate + 1] == f"compiler output goes to {cache_dir / COMPILE_LOG_NAME}"
    assert re.search(rf"^compiling FlashQLA kernels for {SHAPE}: 1/\d+ \w+, \d+ s$", proc.stdout, re.MULTILINE)
    assert re.search(rf"^FlashQLA kernels for {SHAPE} ready in \d+ s \(\d+ compiled\)$", proc.stdout, re.MULTILINE)
    assert_no_compile_chatter(proc.stdout + proc.stderr)
    assert "TileLang begins to compile kernel" in (cache_dir / COMPILE_LOG_NAME).read_text()


@pytest.mark.xdist_group("compile-progress")
def test_doctor_from_the_warm_cache_compiles_nothing_and_keeps_stdout_json(cache_dir):
    proc = gdnctl("doctor", PRESET, "--kernels", "--bench", "--json", "--set", f"launch.kernel_cache_dir={cache_dir}")
    print(proc.stderr)
    data = json.loads(proc.stdout)
    assert {c["name"]: c["status"] for c in data["checks"]}[f"kernels.flashqla.{SHAPE}"] == "OK"
    assert re.search(rf"the kernel cache {re.escape(str(cache_dir))} holds \d+ files", proc.stderr)
    assert f"FlashQLA kernels for {SHAPE} ready in" in proc.stderr
    assert "compiling FlashQLA kernels" not in proc.stderr
    assert_no_compile_chatter(proc.stdout + proc.stderr)


def test_fla_prewarm_fills_the_triton_cache_the_trainer_then_starts_from(tmp_path):
    """FLA's Triton kernels compile into the kernel cache's triton/ folder, a fresh process starts from it, and a
    launch with that kernel_cache_dir warms up from it and, with kernels.torch_compile on (it is off by default),
    fills the inductor cache beside it."""
    cache = tmp_path / "kernel-cache"
    proc = gdnctl("prewarm", PRESET, "--backend", "fla", "--cache-dir", str(cache), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["backend"], report["compiler_cache"]) == ("fla", str(cache / "triton"))
    assert any((cache / "triton").iterdir())
    cold = {t["shape"]: t["first_call_s"] for t in report["compile"]}
    fresh = {t["shape"]: t["first_call_s"] for t in report["fresh_process"]}
    print(json.dumps({"cold_first_call_s": cold, "fresh_process_first_call_s": fresh}))
    # Triton still autotunes in a fresh process (seconds), but compiles nothing: far below the cold first call.
    assert all(fresh[shape] < 0.25 * cold[shape] for shape in cold), (cold, fresh)

    run_dir = tmp_path / "run"
    launch = gdnctl(
        "launch",
        PRESET,
        "-o",
        str(run_dir),
        "--force",
        "--set",
        "kernels.gdn_backend=fla",
        "--set",
        "runtime.transformer_engine=none",
        "--set",
        "train.train_iters=2",
        "--set",
        "kernels.torch_compile=true",
        "--set",
        f"launch.kernel_cache_dir={cache}",
    )
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    warm_up = json.loads((run_dir / "kernel_warm_up.json").read_text())
    assert warm_up["kernel"] == "fla" and warm_up["first_call_s"] < 0.25 * max(cold.values()), warm_up
    assert any((cache / "inductor").rglob("*")), "the trainer's torch.compile'd functions did not reach the cache"
