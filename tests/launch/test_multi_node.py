"""The rendered Slurm script, unchanged, across the nodes of the local two-node Slurm (each a network namespace with
its own address and host name; tests/conftest.py local_slurm_nodes): `gdnctl launch --slurm --wait` of the CPU
selftest with one rank on each node over gloo, a rank that fails on the second node, which that node's own
output reports, and a preemption signal, which only the batch shell gets, requeueing the job on both nodes. The rl
jobs across the nodes are in tests/runtime/rl/test_rl_nodes.py."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.launch.helpers import recorded_calls
from tests.launch.test_launch import SELFTEST, gdnctl
from tests.launch.test_requeue import _launch, stand_in
from tests.slurm_cluster import cluster_nodes, slurm_env

pytestmark = pytest.mark.slurm

# One rank on each of the two nodes.
TWO_NODES = ("--set", "cluster.nodes=2", "--set", "cluster.gpus_per_node=1")


def _log(run_dir: Path) -> str:
    return "".join(path.read_text(errors="replace") for path in sorted((run_dir / "logs").glob("*.out")))


def test_the_selftest_runs_one_rank_on_each_node_over_gloo(tmp_path, local_slurm_nodes):
    first, second = cluster_nodes(local_slurm_nodes)
    run_dir = tmp_path / "run"
    done = gdnctl(
        "launch", SELFTEST, "--slurm", "--wait", "-o", str(run_dir), *TWO_NODES, env=slurm_env(local_slurm_nodes)
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"selftest: where the ranks ran: rank 0 on {first.name}, rank 1 on {second.name}" in done.stdout
    assert "selftest: passed: 7 ok, 0 failed, 0 skipped on 2 ranks (gloo)" in done.stdout
    assert f"on 2 node(s) ({first.name} {second.name}), rendezvous on {first.name}" in done.stdout
    # The first node's launcher held the rendezvous port, and took its published file away at the end.
    assert f"gdnctl: rendezvous on {first.name}:" in done.stdout
    assert not list(run_dir.glob(".gdnctl-rendezvous-*"))


def test_a_rank_that_fails_on_the_second_node_is_reported_from_that_node(tmp_path, local_slurm_nodes):
    """The rank on the second node exits 3 as it starts (a sitecustomize on the job's PYTHONPATH that acts only
    there): that node's launcher names the rank, the node and the exit code; the first node's, stopped by srun
    (--kill-on-bad-exit), says so in a sentence rather than torchrun's traceback; the launch fails, and its last
    line names that rank."""
    first, second = cluster_nodes(local_slurm_nodes)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, socket, sys\n"
        f"if socket.gethostname() == {second.name!r} and 'TORCHELASTIC_RUN_ID' in os.environ:\n"
        "    print(f\"test: rank {os.environ['RANK']} fails on purpose\", file=sys.stderr, flush=True)\n"
        "    os._exit(3)\n"
    )
    env = slurm_env(local_slurm_nodes)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(site)]))
    run_dir = tmp_path / "run"
    done = gdnctl("launch", SELFTEST, "--slurm", "--wait", "-o", str(run_dir), *TWO_NODES, env=env)
    assert done.returncode != 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = _log(run_dir)
    failed = f"gdnctl: the job failed: rank 1 on {second.name} exited with code 3."
    assert "test: rank 1 fails on purpose" in log and failed in log, log[-3000:]
    assert f"gdnctl: torchrun on {first.name} got SIGTERM and stopped its ranks: Slurm stops every node's task" in log
    assert "Traceback" not in log, log[-3000:]
    # The job's exit code is srun's, the highest of its tasks' (the stopped node's 143): the end says what failed.
    assert f"; the first failure its log names: rank 1 on {second.name} exited with code 3" in done.stderr


def test_a_preemption_signal_only_the_batch_shell_gets_requeues_the_job_on_both_nodes(tmp_path, local_slurm_nodes):
    """USR1 goes to the batch shell on the first node alone (--signal=B:USR1); its trap requeues the whole job, and
    the second start runs on both nodes again, every node's task with the script's environment (the restart
    count, this run's rendezvous token). launch.python stands in for the launcher: it records its environment on
    each node, runs until the requeue, and ends at once on the second start."""
    nodes = cluster_nodes(local_slurm_nodes)
    env = slurm_env(local_slurm_nodes)
    run_dir, bin_dir = tmp_path / "run", tmp_path / "bin"
    python = stand_in(bin_dir, finish_on_restart=True)
    launch = _launch(run_dir, python, env, "launch.slurm.time=00:10:00", *(arg for arg in TWO_NODES if arg != "--set"))
    job_id = None
    try:
        deadline = time.monotonic() + 120
        while len(recorded_calls(bin_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        (job_id,) = (run_dir / ".gdnctl-slurm-jobs").read_text().split()
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=env, check=True)
        stdout, stderr = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:
            launch.kill()
        if job_id:
            subprocess.run(["scancel", job_id], env=env, check=False)
    assert launch.returncode == 0, stdout + stderr
    assert "gdnctl: preemption signal received, " in stdout and f"requeueing job {job_id}" in stdout
    calls = [call["env"] for call in recorded_calls(bin_dir)]
    started = sorted((call["GDNCTL_RESTART_COUNT"], call["SLURMD_NODENAME"]) for call in calls)
    assert started == sorted((count, node.name) for count in ("0", "1") for node in nodes), started
    tokens = {
        count: {call["GDNCTL_RENDEZVOUS_TOKEN"] for call in calls if call["GDNCTL_RESTART_COUNT"] == count}
        for count in ("0", "1")
    }
    # One token for both nodes of a start, another for the next start.
    assert len(tokens["0"]) == len(tokens["1"]) == 1 and tokens["0"] != tokens["1"], tokens
