"""The sft smoke run and the first-minute check on a GPU: `gdnctl launch tiny-qwen3.5-sft --smoke` for real.

- the smoke starts the Megatron trainer on the preset's layout, warms the GDN kernel up, takes 2 optimizer steps,
  saves a checkpoint into RUN_DIR/smoke and loads it back into the same model and optimizer (every weight and
  optimizer tensor as it was), and compares the peak CUDA memory with explain's estimate;
- the job's own save dir is never touched;
- a real job logs the first-minute line (peak memory after 2 steps against the estimate) once, after step 2.

Needs a CUDA GPU, megatron-core and FLA (FLA, not the preset's FlashQLA: no TileLang compile). TE-free
(runtime.transformer_engine: none). GDNCTL_GPU_LOG_DIR, when set, receives each launch's console output.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gdnctl.schema import SmokeReport

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core"),
]

PRESET = "tiny-qwen3.5-sft"
COMMON = ["kernels.gdn_backend=fla", "runtime.transformer_engine=none"]
TRAIN_CHECKS = [
    "job start",
    "gdn kernel warm-up",
    "optimizer steps",
    "checkpoint save+load",
    "step time",
    "peak memory",
]


def _launch(run_dir: Path, *args: str, sets: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "gdnctl",
        "launch",
        PRESET,
        "-o",
        str(run_dir),
        "--force",
        *args,
        *(arg for value in (*COMMON, *sets) for arg in ("--set", value)),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1200, check=False)
    log_dir = os.environ.get("GDNCTL_GPU_LOG_DIR")
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        (Path(log_dir) / f"smoke-{run_dir.name}.log").write_text(proc.stdout + proc.stderr)
    return proc


def test_the_sft_smoke_takes_two_steps_and_gives_its_checkpoint_back(tmp_path):
    run_dir, save_dir = tmp_path / "smoke", tmp_path / "checkpoints"
    proc = _launch(run_dir, "--smoke", sets=(f"train.save_dir={save_dir}",))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    report = SmokeReport.model_validate_json((run_dir / "smoke.json").read_text())
    assert [check.name for check in report.checks] == TRAIN_CHECKS
    statuses = {check.name: check.status for check in report.checks}
    assert statuses["optimizer steps"] == "ok" and statuses["checkpoint save+load"] == "ok", report.lines()
    assert statuses["peak memory"] in ("ok", "warn")  # compared with the estimate either way
    measured = report.measured
    assert 0 < measured.estimate_allocated_gib < measured.estimate_peak_memory_gib and measured.peak_memory_gib > 0
    assert measured.memory_source == "CUDA max allocated, most loaded rank"
    assert [line for line in proc.stdout.splitlines() if line.startswith("smoke: ")] == report.lines()
    assert (run_dir / "smoke" / "checkpoints" / "latest").read_text().strip() == "iter_0000002"
    assert not save_dir.exists() and not (run_dir / "metrics.jsonl").exists()


def test_a_real_job_logs_its_first_minute_line_after_step_2(tmp_path):
    proc = _launch(tmp_path / "job", sets=("train.train_iters=3",))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if "first minute:" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("[gdnctl trainer] first minute: peak memory after 2 optimizer steps ")
    assert "GiB (CUDA max allocated, most loaded rank) vs explain's " in lines[0]
    out = proc.stdout
    assert out.index("step 2/3") < out.index("first minute:") < out.index("step 3/3")
