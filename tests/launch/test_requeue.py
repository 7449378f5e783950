"""The Slurm script requeues a preempted job, and a job at its time limit only launch.slurm.time_limit_requeues
times: after that it ends TIMEOUT, and `launch --slurm --wait` returns. On the real single-node Slurm, with the
rendered script and USR1 as Slurm sends it (at the time limit) or as a site's preemption does (scancel --signal)."""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch.helpers import recorded_calls
from tests.launch.test_launch import SELFTEST
from tests.slurm_cluster import slurm_env, wait_for_job

pytestmark = pytest.mark.slurm


def stand_in(directory: Path, finish_on_restart: bool) -> Path:
    """`launch.python` for these jobs: records its environment (calls.jsonl), then runs until it is killed, or
    with `finish_on_restart` ends at once when the job was requeued before (GDNCTL_RESTART_COUNT > 0)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "python"
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, time\n"
        f"with open({str(directory / 'calls.jsonl')!r}, 'a') as out:\n"
        "    out.write(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}) + '\\n')\n"
        f"if {finish_on_restart} and os.environ['GDNCTL_RESTART_COUNT'] != '0':\n"
        "    sys.exit(0)\n"
        "time.sleep(600)\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _launch(run_dir: Path, python: Path, env: dict[str, str], *overrides: str) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "gdnctl",
        "launch",
        SELFTEST,
        "--slurm",
        "--wait",
        "--run-dir",
        str(run_dir),
        "--set",
        f"launch.python={python}",
    ]
    for override in overrides:
        args += ["--set", override]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _restart_counts(directory: Path) -> list[str]:
    return [call["env"]["GDNCTL_RESTART_COUNT"] for call in recorded_calls(directory)]


def test_a_preempted_job_requeues_and_resumes(tmp_path, local_slurm):
    env = slurm_env(local_slurm)
    run_dir, bin_dir = tmp_path / "run", tmp_path / "bin"
    launch = _launch(run_dir, stand_in(bin_dir, finish_on_restart=True), env, "launch.slurm.time=00:10:00")
    job_id = None
    try:
        deadline = time.monotonic() + 120
        while not recorded_calls(bin_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        (job_id,) = (run_dir / ".gdnctl-slurm-jobs").read_text().split()
        # What a site with PreemptParameters=send_user_signal does at a preemption: the job's signal, to the batch
        # shell, long before the time limit.
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, check=True)
        stdout, stderr = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:
            launch.kill()
        if job_id:
            subprocess.run(["scancel", job_id], env=env, check=False)
    assert launch.returncode == 0, stdout + stderr
    assert "gdnctl: preemption signal received, " in stdout and f"requeueing job {job_id}" in stdout
    assert f"job {job_id} ended COMPLETED with exit code 0" in stderr
    assert _restart_counts(bin_dir) == ["0", "1"]


def test_a_job_at_its_time_limit_requeues_as_often_as_the_preset_says_then_ends_timeout(tmp_path, local_slurm):
    env = slurm_env(local_slurm)
    run_dir, bin_dir = tmp_path / "run", tmp_path / "bin"
    # A one-minute limit: USR1 (90 s before it) comes at slurmctld's first time-limit check, every 30 s.
    launch = _launch(
        run_dir,
        stand_in(bin_dir, finish_on_restart=False),
        env,
        "launch.slurm.time='1'",
        "launch.slurm.time_limit_requeues=1",
    )
    try:
        stdout, stderr = launch.communicate(timeout=420)
    finally:
        if launch.poll() is None:
            launch.kill()
        jobs = run_dir / ".gdnctl-slurm-jobs"
        for job_id in jobs.read_text().split() if jobs.exists() else []:
            subprocess.run(["scancel", job_id], env=env, check=False)
            wait_for_job(job_id, env)
    (job_id,) = (run_dir / ".gdnctl-slurm-jobs").read_text().split()
    assert launch.returncode != 0, stdout + stderr
    assert f"job {job_id} ended TIMEOUT" in stderr
    assert f"requeueing job {job_id} (time-limit requeue 1 of 1), to resume from its last checkpoint" in stdout
    assert (
        "after 1 time-limit requeue(s) of launch.slurm.time_limit_requeues=1; the job ends TIMEOUT (its "
        "checkpoints stay in train.save_dir: launch it again to go on)"
    ) in stdout
    assert _restart_counts(bin_dir) == ["0", "1"]
