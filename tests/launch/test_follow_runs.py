"""Following a run from its run dir: `gdnctl status`, `logs`, `cancel`, `runs` and `resume`, each thin over what
the run dir records (manifest.json, the Slurm job ids, the local lock, logs/) and over the real local Slurm."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gdnctl.resources import presets_dir
from tests.launch.helpers import fake_torchrun, write_preset
from tests.slurm_cluster import slurm_env

SELFTEST = presets_dir() / "selftest-cpu.yaml"


def gdnctl(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gdnctl", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


def _until(check, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


@pytest.mark.slurm
def test_a_slurm_job_is_followed_and_cancelled_from_its_run_dir(tmp_path, local_slurm):
    env = slurm_env(local_slurm)
    data = yaml.safe_load(SELFTEST.read_text())
    data["launch"] = {**data["launch"], "python": str(fake_torchrun(tmp_path / "bin"))}  # runs until cancelled
    preset = write_preset(tmp_path / "preset.yaml", data)
    proc = gdnctl("launch", str(preset), "--slurm", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    job_id = (run_dir / ".gdnctl-slurm-jobs").read_text().split()[0]
    assert f"gdnctl status {run_dir}" in proc.stdout and f"gdnctl cancel {run_dir}" in proc.stdout
    assert f"scancel {job_id}" in proc.stdout

    _until(lambda: "RUNNING" in gdnctl("status", str(run_dir), env=env).stdout)
    status = gdnctl("status", str(run_dir), "--json", env=env)
    assert '"state": "RUNNING"' in status.stdout and f'"{job_id}"' in status.stdout
    listed = gdnctl("runs", env=env, cwd=tmp_path)
    assert listed.returncode == 0 and f"RUNNING (Slurm job {job_id})" in listed.stdout

    refused = gdnctl("resume", str(run_dir), env=env)
    assert refused.returncode == 2 and "still has a job running" in refused.stderr

    cancelled = gdnctl("cancel", str(run_dir), env=env)
    assert cancelled.returncode == 0 and f"cancelled Slurm job {job_id}" in cancelled.stdout
    _until(lambda: "CANCELLED" in gdnctl("status", str(run_dir), env=env).stdout)
    again = gdnctl("cancel", str(run_dir), env=env)
    assert again.returncode == 0 and "nothing to cancel" in again.stdout


@pytest.mark.slurm
def test_a_slurm_run_dir_logs_and_resumes(tmp_path, local_slurm):
    env = slurm_env(local_slurm)
    run_dir = tmp_path / "run"
    proc = gdnctl("launch", str(SELFTEST), "--slurm", "--run-dir", str(run_dir), "--set", "selftest.steps=2", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    follow = gdnctl("logs", str(run_dir), "--follow", env=env)
    assert follow.returncode == 0 and "selftest: passed" in follow.stdout
    _until(lambda: "COMPLETED" in gdnctl("status", str(run_dir), env=env).stdout)
    assert "exit code 0" in gdnctl("status", str(run_dir), env=env).stdout
    resumed = gdnctl("resume", str(run_dir), "--wait", env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "to resume the run" in resumed.stdout and "ended COMPLETED with exit code 0" in resumed.stderr
    assert len((run_dir / ".gdnctl-slurm-jobs").read_text().split()) == 2


def test_status_and_logs_of_a_rendered_run_dir_and_of_no_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    assert gdnctl("render", str(SELFTEST), "-o", str(run_dir)).returncode == 0
    status = gdnctl("status", str(run_dir))
    assert status.returncode == 0 and "selftest-cpu (selftest, local) rendered" in status.stdout
    logs = gdnctl("logs", str(run_dir))
    assert logs.returncode == 2 and "has no log yet: it has not been launched" in logs.stderr
    cancel = gdnctl("cancel", str(run_dir))
    assert cancel.returncode == 2 and "no Slurm job to cancel" in cancel.stderr
    for command in ("status", "logs", "cancel", "resume"):
        proc = gdnctl(command, str(tmp_path))
        assert proc.returncode == 2 and "is not a gdnctl run dir" in proc.stderr, (command, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert "no run dirs under runs" in gdnctl("runs", cwd=tmp_path).stdout
    listed = gdnctl("runs", str(tmp_path), "--json")
    assert listed.returncode == 0 and '"state": "rendered"' in listed.stdout


def test_shell_completion_is_offered():
    proc = gdnctl("--help")
    assert "--install-completion" in proc.stdout and "--show-completion" in proc.stdout


# gdnctl under the name the `gdnctl` script gives it (`python -m gdnctl` calls itself "python -m gdnctl").
AS_GDNCTL = [sys.executable, "-c", "from gdnctl.cli import app; app(prog_name='gdnctl')"]


def _bash_completes(line: str) -> list[str]:
    """What the bash script `gdnctl --install-completion` installs offers for `line` with the cursor at its end:
    the completion protocol it speaks (COMP_WORDS, COMP_CWORD and _GDNCTL_COMPLETE), run against gdnctl."""
    env = {
        **os.environ,
        "_GDNCTL_COMPLETE": "complete_bash",
        "COMP_WORDS": line,
        "COMP_CWORD": str(len(line.split(" ")) - 1),
    }
    proc = subprocess.run(AS_GDNCTL, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_shell_completion_completes_commands_and_shipped_preset_names():
    assert _bash_completes("gdnctl sta") == ["status"]
    assert _bash_completes("gdnctl validate qwen3.5-9") == ["qwen3.5-9b-sft"]
    assert "tiny-qwen3.5-rl-cpu" in _bash_completes("gdnctl presets cp tiny")
    # A path: nothing offered, so the script's `-o default` completes file names.
    assert _bash_completes("gdnctl launch examples/") == []
    # typer's --show-completion takes no shell name: it writes the script of the shell it finds among its parent
    # processes (shellingham), so it runs as a child of bash, whatever started pytest (a detached pytest has none).
    script = subprocess.run(
        ["bash", "-c", '"$@"; exit $?', "bash", *AS_GDNCTL, "--show-completion"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "complete -o default -F _gdnctl_completion gdnctl" in script.stdout, script.stdout + script.stderr
