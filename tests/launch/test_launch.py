"""`gdnctl launch` for real: the CPU selftest through the local executor and a real single-node Slurm."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gdnctl.resources import presets_dir
from gdnctl.schema import LOCAL_EXIT_FILE
from tests.launch.helpers import hostile_values, recorded_calls, recorder, write_preset
from tests.slurm_cluster import slurm_env

SELFTEST = str(presets_dir() / "selftest-cpu.yaml")


def gdnctl(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gdnctl", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def selftest_with(tmp_path: Path, **launch) -> Path:
    data = yaml.safe_load(Path(SELFTEST).read_text())
    data["launch"] = {**data.get("launch", {}), **launch}
    return write_preset(tmp_path / "preset.yaml", data)


def ended(run_dir: Path) -> tuple[str, dict, dict]:
    """`gdnctl status` of a run dir (its first line, and its --json) and the exit record the launch left there."""
    text = gdnctl("status", str(run_dir))
    data = gdnctl("status", str(run_dir), "--json")
    assert text.returncode == 0 and data.returncode == 0, text.stderr + data.stderr
    record = json.loads((run_dir / LOCAL_EXIT_FILE).read_text())
    return text.stdout.splitlines()[0], json.loads(data.stdout), record


def test_local_selftest_end_to_end(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    proc = gdnctl("launch", SELFTEST, "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "selftest: passed: 7 ok, 0 failed" in proc.stdout
    profiles = sorted(p.name for p in (run_dir / "comm_profile").iterdir())
    assert profiles == ["comm_profile_rank0.json", "comm_profile_rank1.json"]

    line, data, record = ended(run_dir)
    assert line == f"{run_dir}: selftest-cpu (selftest, local) ended: succeeded, exit code 0"
    assert (data["state"], data["outcome"], data["exit_code"], data["signal"]) == ("ended", "succeeded", 0, None)
    assert record["exit_code"] == 0 and record["stopped"] is False and record["smoke"] is False
    listed = gdnctl("runs", str(tmp_path / "runs"))
    assert listed.returncode == 0 and listed.stdout.splitlines() == [line]


def test_local_failure_is_the_launch_exit_code(tmp_path):
    fake = recorder(tmp_path / "bin", exit_code=3)
    run_dir = tmp_path / "run"
    proc = gdnctl("launch", str(selftest_with(tmp_path, python=str(fake))), "--run-dir", str(run_dir))
    assert proc.returncode == 3
    assert len(recorded_calls(tmp_path / "bin")) == 1

    line, data, record = ended(run_dir)
    assert line == f"{run_dir}: selftest-cpu (selftest, local) ended: failed, exit code 3"
    assert (data["outcome"], data["exit_code"], data["signal"]) == ("failed", 3, None)
    assert record["exit_code"] == 3 and record["signal"] is None
    listed = gdnctl("runs", str(tmp_path), "--json")
    assert [(run["outcome"], run["exit_code"]) for run in json.loads(listed.stdout)] == [("failed", 3)]


def test_a_job_killed_by_a_signal_is_recorded_with_the_signal(tmp_path):
    """The job's launcher (what launch_local.sh execs) killed by SIGKILL, as the OOM killer does: a real script that
    kills itself."""
    killed = tmp_path / "bin" / "killed python"
    killed.parent.mkdir()
    killed.write_text(
        "#!/usr/bin/env bash\n"
        f'if [[ ${{1-}} == -c ]]; then exec {shlex.quote(sys.executable)} "$@"; fi\n'
        "kill -KILL $$\n"
    )
    killed.chmod(0o755)
    run_dir = tmp_path / "run"
    proc = gdnctl("launch", str(selftest_with(tmp_path, python=str(killed))), "--run-dir", str(run_dir))
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr

    line, data, record = ended(run_dir)
    assert line == f"{run_dir}: selftest-cpu (selftest, local) ended: failed, killed by SIGKILL (exit code 137)"
    assert (data["outcome"], data["exit_code"], data["signal"]) == ("failed", 137, "SIGKILL")
    assert record["signal"] == "SIGKILL" and record["stopped"] is False


def test_local_refuses_multi_node(tmp_path):
    proc = gdnctl("launch", "qwen3.5-27b-sft", "--local", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 1 and "LCH001" in proc.stderr and not (tmp_path / "run").exists()


def test_missing_sbatch_is_a_clear_error(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    proc = gdnctl("launch", SELFTEST, "--slurm", "--run-dir", str(tmp_path / "run"), env=env)
    assert proc.returncode == 2 and "sbatch is not on PATH" in proc.stderr and "Traceback" not in proc.stderr
    assert "Nothing was written." in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.slurm
def test_slurm_selftest_end_to_end(tmp_path, local_slurm):
    proc = gdnctl(
        "launch", SELFTEST, "--slurm", "--wait", "--run-dir", str(tmp_path / "run"), env=slurm_env(local_slurm)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "submitted job" in proc.stdout and "selftest: passed: 7 ok, 0 failed" in proc.stdout
    assert "ended COMPLETED with exit code 0" in proc.stderr


@pytest.mark.slurm
def test_slurm_failed_job_fails_the_launch(tmp_path, local_slurm):
    fake = recorder(tmp_path / "bin", exit_code=5)
    proc = gdnctl(
        "launch",
        str(selftest_with(tmp_path, python=str(fake))),
        "--slurm",
        "--wait",
        "--run-dir",
        str(tmp_path / "run"),
        env=slurm_env(local_slurm),
    )
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "ended FAILED with exit code 5" in proc.stderr


@pytest.mark.slurm
def test_slurm_rejected_submission(tmp_path, local_slurm):
    preset = selftest_with(tmp_path, slurm={"partition": "no-such-partition", "time": "00:05:00"})
    proc = gdnctl("launch", str(preset), "--slurm", "--run-dir", str(tmp_path / "run"), env=slurm_env(local_slurm))
    assert proc.returncode == 2 and "sbatch rejected the job" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slurm
def test_slurm_hostile_values_arrive_unchanged(tmp_path, local_slurm):
    canary = tmp_path / "canary"
    values = hostile_values(canary)
    fake_dir = tmp_path / "bin $(touch canary); `x`"
    fake = recorder(fake_dir)
    data = yaml.safe_load(Path(SELFTEST).read_text())
    data["name"] = "$(touch c1)`touch c2`; 'q'"
    data["launch"] = {
        "python": str(fake),
        "env": {f"HOSTILE_{k.upper()}": v for k, v in values.items()},
        "slurm": {"time": "00:05:00", "exclusive": False},
    }
    preset = write_preset(tmp_path / "hostile.yaml", data)
    run_dir = tmp_path / "run dir; $(touch canary)"
    proc = gdnctl("launch", str(preset), "--slurm", "--wait", "--run-dir", str(run_dir), env=slurm_env(local_slurm))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (call,) = recorded_calls(fake_dir)
    for key, value in values.items():
        assert call["env"][f"HOSTILE_{key.upper()}"] == value
    assert call["env"]["GDNCTL_JOB_NAME"] == data["name"]
    assert "--rdzv-endpoint" in call["argv"]
    assert not canary.exists()
    for leftover in ("c1", "c2", "out"):
        assert not list(tmp_path.rglob(leftover)), leftover
