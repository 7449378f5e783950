"""The local Slurm with several nodes (tools/local-slurm.sh start --nodes N): each slurmd in a network namespace of
its own, with its own address and host name, every name resolvable on this host and in every namespace; `stop`
removes every namespace, link, hosts line and process the cluster made, and a `start` after a crash removes what
the crashed cluster left first."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.slurm_cluster import SCRIPT, cluster_nodes, ensure_local_slurm, slurm_env, stop_local_slurm

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-nodes")]


def _srun(env: dict[str, str], nodes: int, command: str) -> list[str]:
    done = subprocess.run(
        ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "bash", "-c", command],
        env=slurm_env(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return sorted(done.stdout.splitlines())


def test_each_node_is_a_host_of_its_own_that_every_host_reaches_by_name(local_slurm_nodes):
    nodes = cluster_nodes(local_slurm_nodes)
    assert len(nodes) == 2 and all(node.namespace for node in nodes)
    # Each task sees its node's host name and address, and the other node's name resolves to that node.
    seen = _srun(
        local_slurm_nodes,
        2,
        'echo "$(hostname) $(hostname -i) '
        + " ".join(f"$(getent hosts {node.name} | cut -d' ' -f1)" for node in nodes)
        + '"',
    )
    addresses = " ".join(node.address for node in nodes)
    assert seen == [f"{node.name} {node.address} {addresses}" for node in nodes]
    for node in nodes:
        assert socket.gethostbyname(node.name) == node.address  # on this host too
        # Loopback and the nodes' own network, no route anywhere else.
        routes = subprocess.run(
            ["ip", "-n", node.namespace, "-4", "route", "show"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        assert len(routes) == 1 and routes[0].startswith(node.address.rsplit(".", 1)[0] + ".0/24 dev eth0"), routes


def _leftovers(state_dir: Path, tag_names: list[str]) -> dict[str, list[str]]:
    """What of the cluster in `state_dir` (its nodes named `tag_names`) is still on this machine."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    tag = tag_names[0].split("-")[1]
    processes = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_CONF={state_dir}/slurm.conf".encode() in environ:
            processes.append(entry.name)
    return {
        "namespaces": [line for line in namespaces.splitlines() if f"-{tag}-" in line],
        "links": [line for line in links.splitlines() if f"gsv{tag}" in line or f"gsb{tag}" in line],
        "hosts lines": [line for line in Path("/etc/hosts").read_text().splitlines() if f"cluster {tag} " in line],
        "processes": processes,
    }


def _crash(env: dict[str, str]) -> None:
    """kill -9 the cluster's slurmctld and every process of its nodes, as a crash of the machine's test run would
    leave them: the namespaces, links and hosts lines stay behind."""
    state_dir = Path(env["LOCAL_SLURM_DIR"])
    pids = [int((state_dir / "run" / "slurmctld.pid").read_text())]
    for node in cluster_nodes(env):
        listed = subprocess.run(["ip", "netns", "pids", node.namespace], capture_output=True, text=True, check=True)
        pids += [int(pid) for pid in listed.stdout.split()]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def test_a_start_after_a_crash_cleans_up_first_and_stop_removes_everything_it_made():
    # Short: slurmstepd's socket paths under the state dir must fit 107 bytes, which pytest's tmp_path does not.
    state_dir = Path(tempfile.mkdtemp(prefix="gdnctl-slurm-", dir="/tmp"))
    env = ensure_local_slurm(state_dir, install=False, nodes=3)
    try:
        names = [node.name for node in cluster_nodes(env)]
        assert len(names) == 3 and len(set(names)) == 3
        _crash(env)
        assert _leftovers(state_dir, names)["namespaces"], "the crash left no namespace to clean up"
        again = ensure_local_slurm(state_dir, install=False, nodes=3)
        assert [node.name for node in cluster_nodes(again)] == names
        assert _srun(again, 3, "hostname") == names
    finally:
        stop_local_slurm(state_dir)
    try:
        assert _leftovers(state_dir, names) == {"namespaces": [], "links": [], "hosts lines": [], "processes": []}
    finally:
        shutil.rmtree(state_dir)


def test_a_state_dir_too_long_for_slurmstepds_sockets_is_refused_with_a_sentence(tmp_path):
    state_dir = tmp_path / ("x" * 80)
    done = subprocess.run(
        ["bash", str(SCRIPT), "start", "--nodes", "2", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "is too long a path for a cluster's state: slurmstepd's sockets" in done.stderr, done.stderr
    assert not state_dir.exists()


def test_more_nodes_than_four_are_refused_with_a_sentence(tmp_path):
    done = subprocess.run(
        ["bash", str(SCRIPT), "start", "--nodes", "5", str(tmp_path / "cluster")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "--nodes must be a number from 1 to 4 (got 5)" in done.stderr
    assert not (tmp_path / "cluster").exists()
