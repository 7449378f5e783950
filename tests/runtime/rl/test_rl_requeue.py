"""Resume that users can trust: an rl job killed mid-run on the local Slurm and requeued continues from its last
checkpoint with the same step, prompts, rollout seeds and reward history, and its curve equals an uninterrupted
run's (CPU: the torch policy in fp32 and vLLM's CPU build, both deterministic for a seed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runtime.rl.conftest import SLURM_SETTINGS, SLURM_STEPS
from tests.runtime.rl.test_rl_vllm import PRESET, VLLM_PYTHON, metrics, needs_vllm, vllm_env

COMPARED = ("step", "reward_mean", "reward_std", "response_length", "loss", "grad_norm", "rollout_logprob_abs_diff")


def _curve(run_dir: Path) -> list[dict]:
    return [{key: step[key] for key in COMPARED} for step in metrics(run_dir)]


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def _logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.is_file() else []


@needs_vllm
@pytest.mark.slurm
def test_a_requeued_rl_job_continues_the_uninterrupted_curve(tmp_path, local_slurm, slurm_rl_run):
    from tests.slurm_cluster import slurm_env, wait_for_job

    # The same job run start to end under Slurm (tests/runtime/rl/conftest.py), shared with the test that rl runs
    # as a Slurm job: this test pays two vLLM engine starts of its own, the first start and the requeued one.
    whole_dir, whole = slurm_rl_run
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]

    env = vllm_env(base=slurm_env(local_slurm))  # as the uninterrupted job's (slurm_rl_run)
    run_dir = tmp_path / "requeued"
    sets = (
        f"rollout.python={VLLM_PYTHON}",
        f"train.save_dir={run_dir / 'checkpoints'}",
        "launch.slurm.time=00:20:00",
        *SLURM_SETTINGS,
    )
    command = [
        sys.executable,
        "-m",
        "gdnctl",
        "launch",
        PRESET,
        "--slurm",
        "--json",
        "-o",
        str(run_dir),
        *(arg for value in sets for arg in ("--set", value)),
    ]
    submitted = subprocess.run(command, text=True, capture_output=True, timeout=120, env=env, check=False)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]

    # Kill it after step 3 is logged: the last checkpoint is step 2's (or a later one, if steps ran on while the
    # requeue was on its way), and the steps taken after it must be redone.
    _wait_for(lambda: 3 in _logged_steps(run_dir), 600, "step 3 of the first start")
    requeue = subprocess.run(["scontrol", "requeue", job_id], text=True, capture_output=True, env=env, check=False)
    assert requeue.returncode == 0, requeue.stderr
    state, code, _ = wait_for_job(job_id, env, timeout=900)
    assert (state, code) == ("COMPLETED", 0), (state, code, _job_logs(run_dir))

    logs = _job_logs(run_dir)
    resumed = re.search(r"resumed from \S+ at step (\d+)", logs)
    assert resumed, logs[-3000:]
    assert 2 <= int(resumed.group(1)) < SLURM_STEPS and int(resumed.group(1)) % 2 == 0, resumed.group(0)
    # One history, as if never interrupted: each step once, in order, with the uninterrupted run's values.
    assert _curve(run_dir) == _curve(whole_dir), (_curve(run_dir), _curve(whole_dir))
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"iter_{SLURM_STEPS:07d}"


def _job_logs(run_dir: Path) -> str:
    return "".join(path.read_text(errors="replace") for path in sorted((run_dir / "logs").glob("*.out")))
