"""Stopping gdnctl stops its job: SIGTERM, SIGINT and SIGHUP to `gdnctl launch` reach the whole process tree (ranks
in sessions of their own included), a job that ignores them is killed after the grace period or on a second
signal, and the run dir's lock goes with it. Real processes throughout: the CPU selftest's torchrun and ranks, and
a stand-in torchrun whose ranks outlive a dead parent as torch's do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gdnctl.cli import app
from tests.launch.helpers import alive, fake_torchrun, started_pids
from tests.launch.test_launch import SELFTEST
from tests.slurm_cluster import slurm_env, wait_for_job

GDNCTL = [sys.executable, "-m", "gdnctl"]


def _launch(run_dir: Path, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [*GDNCTL, "launch", SELFTEST, "--run-dir", str(run_dir), *args],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


def _gone(pids: list[int], timeout: float = 5) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def _kill(pids: list[int]) -> None:
    """Clean up after a failed test: the processes this test started, by pid."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def _rerender_is_admitted(run_dir: Path) -> None:
    """The run dir's lock went with the job: --force is admitted again."""
    result = CliRunner().invoke(app, ["render", "selftest-cpu", "-o", str(run_dir), "--force"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_gdnctl_stops_every_process_of_the_job(tmp_path, sig):
    fake = fake_torchrun(tmp_path / "bin")
    run_dir = tmp_path / "run"
    launch = _launch(run_dir, "--set", f"launch.python={fake}")
    pids = started_pids(tmp_path / "bin")
    try:
        launch.send_signal(sig)
        _, stderr = launch.communicate(timeout=30)
        assert launch.returncode == 128 + sig, stderr
        assert _gone(pids) == []
    finally:
        _kill(pids)
    assert (
        f"gdnctl: stopped by {sig.name}: the job (bash {run_dir.resolve()}/launch_local.sh and every process it "
        "started) was sent SIGTERM and all 5 of its processes ended within" in stderr
    )
    assert "Traceback" not in stderr
    status = CliRunner().invoke(app, ["status", str(run_dir)])
    assert status.stdout.splitlines()[0] == (
        f"{run_dir}: selftest-cpu (selftest, local) ended: stopped by gdnctl on {sig.name} (exit code {128 + sig})"
    )
    _rerender_is_admitted(run_dir)


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    fake = fake_torchrun(tmp_path / "bin", ignore_term=True)
    run_dir = tmp_path / "run"
    assert (
        CliRunner().invoke(app, ["render", SELFTEST, "-o", str(run_dir), "--set", f"launch.python={fake}"]).exit_code
        == 0
    )
    code = (
        "import sys; from pathlib import Path; from gdnctl.launch.process_tree import run_job, JobStopped\n"
        "try:\n    run_job(['bash', 'launch_local.sh'], Path(sys.argv[1]), grace=1.0)\n"
        "except JobStopped as stopped:\n    print(stopped, file=sys.stderr); sys.exit(stopped.exit_code)\n"
    )
    runner = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], text=True, stderr=subprocess.PIPE)
    pids = started_pids(tmp_path / "bin")
    try:
        runner.send_signal(signal.SIGTERM)
        _, stderr = runner.communicate(timeout=30)
        assert runner.returncode == 128 + signal.SIGTERM, stderr
        assert _gone(pids) == []
    finally:
        _kill(pids)
    assert "was sent SIGTERM, and 5 of its 5 processes still ran after 1 s and were killed (SIGKILL)" in stderr
    _rerender_is_admitted(run_dir)


def test_a_second_signal_kills_the_job_at_once(tmp_path):
    fake = fake_torchrun(tmp_path / "bin", ignore_term=True)
    launch = _launch(tmp_path / "run", "--set", f"launch.python={fake}")
    pids = started_pids(tmp_path / "bin")
    try:
        launch.send_signal(signal.SIGINT)
        time.sleep(0.5)
        started = time.monotonic()
        launch.send_signal(signal.SIGINT)
        _, stderr = launch.communicate(timeout=30)
        assert time.monotonic() - started < 10  # not the 40 s grace period
        assert launch.returncode == 128 + signal.SIGINT, stderr
        assert _gone(pids) == []
    finally:
        _kill(pids)
    assert "5 of its 5 processes still ran on a second signal and were killed (SIGKILL)" in stderr


def _selftest_processes(engine_yaml: Path) -> list[int]:
    """torchrun and its ranks: every process whose command line names this run's engine.yaml."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(engine_yaml).encode() in argv and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def test_sigterm_stops_the_cpu_selftest_torchrun_and_its_ranks(tmp_path):
    run_dir = tmp_path / "run"
    launch = _launch(run_dir, "--set", "selftest.steps=1000")
    deadline = time.monotonic() + 120
    processes: list[int] = []
    while len(processes) < 3 and time.monotonic() < deadline:  # torchrun and its 2 ranks
        processes = _selftest_processes(run_dir.resolve() / "engine.yaml")
        time.sleep(0.05)
    try:
        assert len(processes) == 3, "the selftest's ranks did not start"
        launch.send_signal(signal.SIGTERM)
        _, stderr = launch.communicate(timeout=60)
        assert launch.returncode == 128 + signal.SIGTERM, stderr
        assert "gdnctl: stopped by SIGTERM: the job (bash " in stderr
        assert _gone(processes) == [] and _selftest_processes(run_dir.resolve() / "engine.yaml") == []
    finally:
        _kill(processes)
    _rerender_is_admitted(run_dir)


@pytest.mark.slurm
def test_stopping_slurm_wait_stops_following_and_says_the_job_goes_on(tmp_path, local_slurm):
    env = slurm_env(local_slurm)
    fake = fake_torchrun(tmp_path / "bin")
    run_dir = tmp_path / "run"
    launch = _launch(run_dir, "--slurm", "--wait", "--set", f"launch.python={fake}", env=env)
    started_pids(tmp_path / "bin")
    (job_id,) = (run_dir / ".gdnctl-slurm-jobs").read_text().split()
    try:
        launch.send_signal(signal.SIGINT)
        _, stderr = launch.communicate(timeout=30)
        assert launch.returncode == 128 + signal.SIGINT, stderr
        assert (
            f"gdnctl: stopped following Slurm job {job_id} on SIGINT; the job goes on (scancel {job_id} stops it)"
        ) in stderr
        state = subprocess.run(
            ["squeue", "--noheader", "--format=%T", "--jobs", job_id],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert state == "RUNNING"
    finally:
        subprocess.run(["scancel", job_id], env=env, check=False)
        wait_for_job(job_id, env)
