"""Real jobs on the local single-node Slurm cluster (tools/local-slurm.sh).

Set GDNCTL_SLURM_TESTS=0 to skip; set GDNCTL_KEEP_SLURM=1 to leave a cluster this session
started running afterwards (a cluster that was already up is always left running).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.slurm_cluster import job_exit_code, local_slurm_running, slurm_env, wait_for_job

pytestmark = pytest.mark.slurm

JOB_TIMEOUT_S = 120


def _sbatch_wait(script: Path, env: dict[str, str]) -> tuple[int, str]:
    """Submit with --wait; return (sbatch's exit status, job id)."""
    proc = subprocess.run(
        ["sbatch", "--wait", "--parsable", str(script)],
        env=slurm_env(env),
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )
    job_id = proc.stdout.strip().split(";")[0]
    assert job_id.isdigit(), f"sbatch printed no job id: {proc.stdout!r} {proc.stderr!r}"
    return proc.returncode, job_id


def test_job_runs_with_srun_step(local_slurm: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "job-%j.out"
    script = tmp_path / "ok.sbatch"
    # The directives gdnctl renders: one task per node, requeue on preemption, early USR1.
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name=gdnctl-ok\n"
        "#SBATCH --nodes=1\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH --cpus-per-task=1\n"
        f"#SBATCH --output={out}\n"
        "#SBATCH --requeue\n"
        "#SBATCH --signal=USR1@90\n"
        "#SBATCH --time=00:05:00\n"
        'echo "batch on $(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"\n'
        "srun --ntasks=1 bash -c 'echo \"step $SLURM_STEP_ID rank $SLURM_PROCID of $SLURM_NTASKS\"'\n"
    )
    rc, job_id = _sbatch_wait(script, local_slurm)
    assert rc == 0
    text = Path(str(out).replace("%j", job_id)).read_text()
    assert "batch on " in text
    assert "step 0 rank 0 of 1" in text
    assert job_exit_code(job_id, local_slurm) == ("COMPLETED", 0, 0)


def test_failing_job_exit_code(local_slurm: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "fail-%j.out"
    script = tmp_path / "fail.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=1 --ntasks-per-node=1\n"
        f"#SBATCH --output={out}\n"
        "srun true\n"
        "echo about to fail\n"
        "exit 3\n"
    )
    rc, job_id = _sbatch_wait(script, local_slurm)
    assert rc == 3  # sbatch --wait exits with the job's exit code
    assert "about to fail" in Path(str(out).replace("%j", job_id)).read_text()
    assert job_exit_code(job_id, local_slurm) == ("FAILED", 3, 0)
    # The permanent record (no accounting): one jobcomp/filetxt line per finished job.
    jobcomp = Path(local_slurm["LOCAL_SLURM_DIR"]) / "log" / "jobcomp.txt"
    lines = [ln for ln in jobcomp.read_text().splitlines() if ln.startswith(f"JobId={job_id} ")]
    assert lines and "ExitCode=3:0" in lines[-1]


def test_wait_for_job_without_sbatch_wait(local_slurm: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=1",
            "--ntasks-per-node=1",
            "--cpus-per-task=1",
            f"--output={tmp_path / 'wrap-%j.out'}",
            "--wrap",
            "srun bash -c 'exit 7'",
        ],
        env=slurm_env(local_slurm),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    job_id = proc.stdout.strip().split(";")[0]
    # The batch script's status is its last command's: srun passes on the step's exit code.
    assert wait_for_job(job_id, local_slurm, timeout=JOB_TIMEOUT_S) == ("FAILED", 7, 0)


def test_status_reports_healthy(local_slurm: dict[str, str]) -> None:
    assert local_slurm_running(local_slurm["LOCAL_SLURM_DIR"])


SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "local-slurm.sh"


def _ports(conf: str) -> tuple[int, int]:
    values = dict(
        line.split("=", 1) for line in conf.splitlines() if line.startswith(("SlurmctldPort=", "SlurmdPort="))
    )
    return int(values["SlurmctldPort"]), int(values["SlurmdPort"])


def test_a_second_cluster_picks_ports_the_running_one_does_not_hold(
    local_slurm: dict[str, str], tmp_path: Path
) -> None:
    """Another Slurm on the machine (here the session's own cluster) holds its ports: a cluster in another
    directory gets a free pair instead of failing to bind (or talking to the other cluster)."""
    running = _ports(Path(local_slurm["SLURM_CONF"]).read_text())
    done = subprocess.run(
        ["bash", str(SCRIPT), "conf", str(tmp_path / "other")], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    chosen = _ports(done.stdout)
    assert not set(chosen) & set(running), (chosen, running)


def test_ports_the_caller_names_that_are_taken_are_refused_with_a_sentence(local_slurm: dict[str, str]) -> None:
    running = _ports(Path(local_slurm["SLURM_CONF"]).read_text())
    env = {**slurm_env({}), "LOCAL_SLURM_CTLD_PORT": str(running[0]), "LOCAL_SLURM_SLURMD_PORT": str(running[1])}
    # A short state dir: under an xdist worker pytest's tmp_path can be longer than slurmstepd's socket paths
    # allow, and start would refuse the path before it ever looks at the ports.
    with tempfile.TemporaryDirectory(prefix="ls-", dir="/tmp") as state:
        done = subprocess.run(
            ["bash", str(SCRIPT), "start", str(Path(state) / "other")],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
    assert done.returncode == 1
    assert f"port {running[0]} on 127.0.0.1 is already in use" in done.stderr, done.stderr
    assert "cannot start there" in done.stderr
