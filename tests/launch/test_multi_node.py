"""The rendered Slurm script, unchanged, across the nodes of the local two-node Slurm (each a network namespace with
its own address and host name; tests/conftest.py local_slurm_nodes): `gdnctl launch --slurm --wait` of the CPU
selftest with one rank on each node over gloo, and a rank that fails on the second node, which that node's own
output reports. The rl jobs across the nodes are in tests/runtime/rl/test_rl_nodes.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.launch.test_launch import SELFTEST, gdnctl
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
