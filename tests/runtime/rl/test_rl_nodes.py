"""CPU rl across the nodes of the local two-node Slurm (tests/conftest.py local_slurm_nodes), with the rendered script
unchanged: the trainer on the first node, the Slurm script's rollout step (vLLM's CPU build) on the second, the
weights broadcast over gloo between them and checked after every sync as on one node. The same job requeued
midway resumes at its last checkpoint with the uninterrupted run's metrics; `gdnctl cancel` ends every node's
processes and keeps what was saved; a node lost mid-job (its link taken down) ends the job within Slurm's
SlurmdTimeout with a sentence naming the node, and `latest` stays on the last complete checkpoint."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gdnctl.runtime.model.resume_choice import latest_checkpoint
from tests.runtime.rl.conftest import SLURM_SETTINGS, SLURM_STEPS
from tests.runtime.rl.test_rl_vllm import PRESET, VLLM_PYTHON, metrics, needs_vllm, vllm_env
from tests.slurm_cluster import NODES_DIR, cluster_nodes, ensure_local_slurm, slurm_env, wait_for_job

pytestmark = [needs_vllm, pytest.mark.slurm]

# The trainer on one node, the rollout step on the other; the weights by broadcast (over gloo on CPU).
NODE_SETTINGS = ("cluster.nodes=2", "rollout.colocate=false", "rollout.weight_sync=broadcast")
COMPARED = ("step", "reward_mean", "reward_std", "response_length", "loss", "grad_norm", "rollout_logprob_abs_diff")
# Long enough that the job still runs when a test stops it, whatever the machine's speed.
LONG = ("train.train_iters=200", "eval=null")


def _command(run_dir: Path, *sets: str, wait: bool) -> list[str]:
    sets = (
        f"rollout.python={VLLM_PYTHON}",
        f"train.save_dir={run_dir / 'checkpoints'}",
        "launch.slurm.time=00:20:00",
        *SLURM_SETTINGS,
        *NODE_SETTINGS,
        *sets,
    )
    command = [sys.executable, "-m", "gdnctl", "launch", PRESET, "--slurm", "-o", str(run_dir)]
    command += ["--wait"] if wait else ["--json"]
    return command + [arg for value in sets for arg in ("--set", value)]


def _submit(run_dir: Path, env: dict[str, str], *sets: str) -> str:
    submitted = subprocess.run(
        _command(run_dir, *sets, wait=False), text=True, capture_output=True, timeout=120, env=env
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return json.loads(submitted.stdout)["job_id"]


def _env(cluster: dict[str, str]) -> dict[str, str]:
    return vllm_env(base=slurm_env(cluster))


def _wait_for(predicate, timeout: float, what: str, left=None) -> None:
    """Wait for `predicate`; past `timeout` fail, saying what `left()` finds still there."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            still = f": {left()}" if left is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{still}")
        time.sleep(0.5)


def _logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.is_file() else []


def _job_log(run_dir: Path) -> str:
    return "".join(path.read_text(errors="replace") for path in sorted((run_dir / "logs").glob("*.out")))


def _curve(run_dir: Path) -> list[dict]:
    return [{key: step[key] for key in COMPARED} for step in metrics(run_dir)]


def _saved_intact(save_dir: Path) -> Path:
    """The checkpoint `latest` names, checked whole (every file it recorded, with its size and checksum) as a
    resume would check it; and no file of a save cut short left beside it."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{save_dir.parent / 'check-store'}", rank=0, world_size=1)
    try:
        chosen = latest_checkpoint(save_dir)
    finally:
        dist.destroy_process_group()
    assert chosen is not None and chosen.name == (save_dir / "latest").read_text().strip()
    assert not [path for path in save_dir.rglob("*") if path.name.endswith(".tmp")]
    return chosen


def _job_processes(namespace: str) -> list[str]:
    """What runs in a node's namespace beside its slurmd: a job's processes."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, check=True).stdout
    commands = []
    for pid in pids.split():
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:  # ended meanwhile
            continue
        if name != "slurmd":
            commands.append(f"{pid} {name}")
    return commands


@pytest.fixture(scope="module")
def nodes_rl_run(tmp_path_factory, local_slurm_nodes) -> tuple[Path, subprocess.CompletedProcess]:
    """The job start to end across the two nodes (`launch --slurm --wait`): its run dir and the launch's result;
    the curve a requeued job must continue."""
    run_dir = tmp_path_factory.mktemp("nodes-rl") / "run"
    command = _command(run_dir, "eval.max_prompts=4", wait=True)
    done = subprocess.run(command, text=True, capture_output=True, timeout=900, env=_env(local_slurm_nodes))
    return run_dir, done


def test_the_trainer_runs_on_one_node_and_the_rollout_step_on_the_other(local_slurm_nodes, nodes_rl_run):
    first, second = cluster_nodes(local_slurm_nodes)
    run_dir, done = nodes_rl_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = _job_log(run_dir)
    # The rollout step's server listens on the second node's address, and the trainer found it there.
    assert f"gdnctl rollout: listening on {second.address}:" in log
    assert json.loads((run_dir / "rollout" / "address.json").read_text())["host"] == second.name
    assert "rollout engines: 1 of rollout.tp 1 (the Slurm script's rollout step, on nodes of its own)" in log
    # Trainer rank 0 hosts the weight group's store on the first node; the worker on the second joins it.
    assert f"weight group up: trainer rank 0 and 1 rollout worker(s) of 1 engine(s) over gloo ({first.name}:" in log
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == list(range(1, SLURM_STEPS + 1))
    assert all(s["weight_transport"] == "broadcast" and s["synced_parameters"] > 0 for s in steps)
    # Every sync checked as on one node: the probe, and the samples scored by the trainer as vLLM scored them.
    assert all(s["probe_logprob_abs_diff"] < 0.01 for s in steps), [s["probe_logprob_abs_diff"] for s in steps]
    assert all(s["rollout_logprob_abs_diff"] < 0.01 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]


def test_a_requeued_two_node_job_continues_the_uninterrupted_curve(tmp_path, local_slurm_nodes, nodes_rl_run):
    whole_dir, whole = nodes_rl_run
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    env = _env(local_slurm_nodes)
    run_dir = tmp_path / "requeued"
    job_id = _submit(run_dir, env, "eval.max_prompts=4")
    _wait_for(lambda: 3 in _logged_steps(run_dir), 600, "step 3 of the first start")
    requeue = subprocess.run(["scontrol", "requeue", job_id], text=True, capture_output=True, env=env, check=False)
    assert requeue.returncode == 0, requeue.stderr
    state, code, _ = wait_for_job(job_id, env, timeout=900)
    log = _job_log(run_dir)
    assert (state, code) == ("COMPLETED", 0), log[-3000:]
    resumed = re.search(r"resumed from \S+ at step (\d+)", log)
    assert resumed, log[-3000:]
    assert 2 <= int(resumed.group(1)) < SLURM_STEPS and int(resumed.group(1)) % 2 == 0, resumed.group(0)
    assert "restart 1" in log  # the second start of the script, on both nodes again
    assert _curve(run_dir) == _curve(whole_dir), (_curve(run_dir), _curve(whole_dir))


def test_cancel_ends_every_nodes_processes_and_keeps_what_was_saved(tmp_path, local_slurm_nodes):
    nodes = cluster_nodes(local_slurm_nodes)
    env = _env(local_slurm_nodes)
    run_dir = tmp_path / "run"
    job_id = _submit(run_dir, env, *LONG)
    _wait_for(lambda: (run_dir / "checkpoints" / "latest").is_file(), 600, "the first checkpoint")
    assert all(_job_processes(node.namespace) for node in nodes), "the job does not run on both nodes"
    cancelled = subprocess.run(
        [sys.executable, "-m", "gdnctl", "cancel", str(run_dir)], text=True, capture_output=True, env=env, timeout=60
    )
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert wait_for_job(job_id, env, timeout=120)[0] == "CANCELLED"
    # Slurm's KillWait (10 s) after its SIGTERM, then SIGKILL: nothing of the job is left on either node.
    _wait_for(
        lambda: not any(_job_processes(node.namespace) for node in nodes),
        60,
        "the job's processes to end",
        left=lambda: {node.name: _job_processes(node.namespace) for node in nodes},
    )
    _saved_intact(run_dir / "checkpoints")


def test_a_node_lost_mid_job_ends_it_in_bounded_time_with_a_sentence_naming_the_node(tmp_path, local_slurm_nodes):
    """The rollout node's link goes down after the first checkpoint: nobody gets an error (no reset crosses a
    link that is down), so Slurm's SlurmdTimeout (20 s on the local cluster) is what ends the job, NODE_FAIL with
    launch.slurm.requeue false; `--wait` names the node and returns non-zero."""
    second = cluster_nodes(local_slurm_nodes)[1]
    env = _env(local_slurm_nodes)
    run_dir = tmp_path / "run"
    command = _command(run_dir, *LONG, "launch.slurm.requeue=false", wait=True)
    launch = subprocess.Popen(command, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        _wait_for(lambda: (run_dir / "checkpoints" / "latest").is_file(), 600, "the first checkpoint")
        subprocess.run(["ip", "-n", second.namespace, "link", "set", "eth0", "down"], check=True)
        lost = time.monotonic()
        stdout, stderr = launch.communicate(timeout=240)
        ended = time.monotonic() - lost
    finally:
        if launch.poll() is None:
            launch.kill()
        subprocess.run(["ip", "-n", second.namespace, "link", "set", "eth0", "up"], check=False)
        # The lost node's processes still run behind the link, and slurmctld holds the node down until it answers
        # again: a fresh start of the cluster ends them and gives the next test both nodes.
        ensure_local_slurm(NODES_DIR, install=False, nodes=2)
    assert launch.returncode != 0, stdout[-2000:] + stderr[-2000:]
    (job_id,) = (run_dir / ".gdnctl-slurm-jobs").read_text().split()
    assert f"gdnctl: job {job_id} ended NODE_FAIL" in stderr, stderr[-3000:]
    assert (
        f"gdnctl: node {second.name} (Not responding; Slurm holds it down*) of job {job_id} failed, so Slurm "
        "ended the job on every node"
    ) in stderr, stderr[-3000:]
    assert ended < 120, f"the job ended {ended:.0f} s after the node was lost"
    _saved_intact(run_dir / "checkpoints")
