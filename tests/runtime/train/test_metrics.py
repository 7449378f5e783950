"""Every job's metrics where people look at them: metrics.jsonl and TensorBoard event files in the run dir
(read back with TensorBoard's own reader), and an offline W&B run that keeps its id across a requeue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdnctl.runtime.train.metrics import eta_text, mfu, wandb_run_id

REPO = Path(__file__).resolve().parents[3]


def _launch(run_dir: Path, *overrides: str, restart_count: int | None = None) -> subprocess.CompletedProcess:
    """`gdnctl launch selftest-cpu` (a real torchrun job of 2 CPU ranks), or a rerun of its rendered script."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_SILENT": "true"}
    if restart_count is None:
        command = [
            sys.executable,
            "-m",
            "gdnctl",
            "launch",
            "selftest-cpu",
            "--run-dir",
            str(run_dir),
            *[part for value in overrides for part in ("--set", value)],
        ]
    else:  # what a Slurm requeue does: the same run dir's script again, with the restart counted
        env["GDNCTL_RESTART_COUNT"] = str(restart_count)
        command = ["bash", str(run_dir / "launch_local.sh")]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=run_dir.parent)


def test_a_selftest_job_writes_tensorboard_events_that_tensorboard_reads(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    proc = _launch(run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "metrics" in proc.stdout and "TensorBoard events in tensorboard/" in proc.stdout
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert "selftest/round_seconds" in events.Tags()["scalars"]
    steps = [event.step for event in events.Scalars("selftest/round_seconds")]
    assert steps == [1, 2, 3]  # selftest-cpu runs 3 steps
    assert [event.value for event in events.Scalars("selftest/collectives")][0] > 0
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["round_seconds"] for line in lines] == pytest.approx(
        [event.value for event in events.Scalars("selftest/round_seconds")], rel=1e-5
    )


def test_an_offline_wandb_run_keeps_its_id_across_a_requeue(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    first = _launch(run_dir, "metrics.wandb.project=gdnctl-tests", "metrics.wandb.mode=offline")
    assert first.returncode == 0, first.stdout + first.stderr
    run_id = (run_dir / "wandb" / "run_id").read_text().strip()
    assert f"W&B run {run_id}" in first.stdout
    again = _launch(run_dir, restart_count=1)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (run_dir / "wandb" / "run_id").read_text().strip() == run_id
    offline_runs = sorted((run_dir / "wandb" / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 2 and all(path.name.endswith(run_id) for path in offline_runs)


def test_wandb_run_id_is_made_once_per_run_dir(tmp_path):
    first = wandb_run_id(tmp_path)
    assert wandb_run_id(tmp_path) == first and len(first) == 12
    assert wandb_run_id(tmp_path / "other") != first


def test_mfu_is_against_the_dense_peak_and_absent_without_one():
    assert mfu(494.5, 989.0) == pytest.approx(0.5)
    assert mfu(10.0, None) is None


@pytest.mark.parametrize(
    "done, total, pace, text",
    [
        (10, 100, 2.0, "ETA 3m00s"),
        (1, 1001, 36.0, "ETA 10h00m"),
        (5, 5, 1.0, "ETA 0m00s"),
        (1, 3, float("inf"), "ETA ?"),
    ],
)
def test_eta_reads_as_hours_or_minutes(done, total, pace, text):
    assert eta_text(done, total, pace) == text


def test_a_long_phase_says_it_started_and_keeps_saying_it_is_still_going():
    import time

    from gdnctl.runtime.train import progress

    lines: list[str] = []
    with progress("starting the rollout's vLLM engine", lines.append, every=0.05):
        time.sleep(0.18)
    assert lines[0] == "starting the rollout's vLLM engine ..."
    ticks = lines[1:]
    assert 2 <= len(ticks) <= 4 and all("still going after" in line for line in ticks), lines
    with progress("a phase on a rank that does not print", None, every=0.01):
        time.sleep(0.03)  # no say function: nothing to call, nothing started
