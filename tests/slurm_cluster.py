"""Start, reuse and stop the throw-away Slurm clusters of ``tools/local-slurm.sh``: one node on loopback, or
several, each a network namespace with an address and a host name of its own.

Tests use them through fixtures (tests/conftest.py ``local_slurm``, ``local_slurm_nodes``)::

    env = ensure_local_slurm()          # {"SLURM_CONF": ..., "LOCAL_SLURM_DIR": ...}
    subprocess.run(["sbatch", "--wait", script], env=slurm_env(env))
    env = ensure_local_slurm(NODES_DIR, nodes=2)
    cluster_nodes(env)                  # [Node(name, address, namespace), ...]

The cluster has no accounting (``sacct`` fails), so a finished job's exit code is read with
:func:`job_exit_code` (``scontrol show job`` while the job is still known to slurmctld, i.e. for
``MinJobAge`` = 1 day, then the jobcomp/filetxt record). ``sbatch --wait`` itself also exits
with the job's exit code, but it polls after 2 s, 8 s, then every 32 s (a 3 s job returns after
10 s); :func:`wait_for_job` polls every 0.25 s instead.

Needs root and Debian's apt (``install`` fetches slurmctld, slurmd, slurm-client and munge once).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "local-slurm.sh"

INSTALL_TIMEOUT_S = 600
# The state dir of the two-node cluster (tests/conftest.py local_slurm_nodes), beside the one-node cluster's.
NODES_DIR = "/tmp/gdnctl-local-slurm-nodes"
START_TIMEOUT_S = 120  # the script itself gives the node 30 s to become idle


def _state_dir(state_dir: str | os.PathLike[str] | None) -> list[str]:
    return [os.fspath(state_dir)] if state_dir is not None else []


def _run_script(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["bash", os.fspath(SCRIPT), *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(
            f"{SCRIPT.name} {' '.join(args)} timed out after {timeout:.0f}s\n"
            f"{_tail(exc.stderr)}\n{_log_tail(args[1] if len(args) > 1 else None)}"
        ) from exc


def _tail(text: str | bytes | None, lines: int = 40) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _default_dir(state_dir: str | None) -> Path:
    return Path(state_dir or os.environ.get("LOCAL_SLURM_DIR") or "/tmp/gdnctl-local-slurm")


def _log_tail(state_dir: str | None, lines: int = 25) -> str:
    out = []
    log_dir = _default_dir(state_dir) / "log"
    for log in sorted(log_dir.glob("*.stderr")) + sorted(log_dir.glob("slurm*.log")):
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        out.append(f"==> {log} <==\n{_tail(text, lines)}")
    return "\n".join(out)


def _parse_exports(stdout: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            env[key] = value
    return env


def local_slurm_running(state_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when a cluster started by the script is up and its node accepts jobs."""
    if not SCRIPT.exists():
        return False
    return _run_script("status", *_state_dir(state_dir), timeout=60).returncode == 0


def ensure_local_slurm(
    state_dir: str | os.PathLike[str] | None = None, *, install: bool = True, nodes: int = 1
) -> dict[str, str]:
    """Install (if missing) and start (or reuse) the local cluster of `nodes` nodes; return the env vars to use.

    Raises RuntimeError with the script's error and the daemons' log tails on failure.
    """
    if os.name != "posix" or os.geteuid() != 0:
        raise RuntimeError("the local Slurm cluster needs root (it starts munged, slurmctld, slurmd)")
    if not SCRIPT.exists():
        raise RuntimeError(f"{SCRIPT} not found")
    if install:
        proc = _run_script("install", timeout=INSTALL_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"{SCRIPT.name} install failed (exit {proc.returncode}):\n{_tail(proc.stderr)}")
    proc = _run_script(
        "start", *(["--nodes", str(nodes)] if nodes != 1 else []), *_state_dir(state_dir), timeout=START_TIMEOUT_S
    )
    env = _parse_exports(proc.stdout)
    if proc.returncode != 0 or "SLURM_CONF" not in env:
        sd = os.fspath(state_dir) if state_dir is not None else None
        raise RuntimeError(
            f"{SCRIPT.name} start failed (exit {proc.returncode}):\n{_tail(proc.stderr, 80)}\n{_log_tail(sd)}"
        )
    return env


def stop_local_slurm(state_dir: str | os.PathLike[str] | None = None) -> None:
    """Stop the daemons the script started (jobs are cancelled first). Raises on failure."""
    if not SCRIPT.exists():
        return
    proc = _run_script("stop", *_state_dir(state_dir), timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{SCRIPT.name} stop failed (exit {proc.returncode}):\n{_tail(proc.stderr)}")


@dataclass(frozen=True)
class Node:
    """A node of the local cluster: its Slurm (and host) name, its address, and its network namespace (None for the
    one-node cluster's, which runs on this host)."""

    name: str
    address: str
    namespace: str | None


def cluster_nodes(env: dict[str, str]) -> list[Node]:
    """The nodes of the cluster `env` names (tools/local-slurm.sh nodes), in order."""
    proc = _run_script("nodes", env["LOCAL_SLURM_DIR"], timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{SCRIPT.name} nodes failed: {proc.stderr.strip()}")
    nodes = []
    for line in proc.stdout.splitlines():
        name, address, namespace = line.split()
        nodes.append(Node(name, address, None if namespace == "-" else namespace))
    return nodes


def slurm_env(env: dict[str, str]) -> dict[str, str]:
    """os.environ without a surrounding job's SLURM_* variables, plus the cluster's ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    return {**base, **env}


_EXIT_RE = re.compile(r"(?:^|\s)ExitCode=(\d+):(\d+)(?:\s|$)")
_STATE_RE = re.compile(r"(?:^|\s)JobState=(\S+)")


def job_exit_code(job_id: str | int, env: dict[str, str]) -> tuple[str, int, int]:
    """(JobState, exit code, signal) of a finished job, without accounting.

    First asks slurmctld (``scontrol -o show job``: finished jobs stay for MinJobAge), then falls
    back to the jobcomp/filetxt record the script configures (``$LOCAL_SLURM_DIR/log/jobcomp.txt``).
    """
    job_id = str(job_id)
    proc = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id],
        env=slurm_env(env),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    candidates = [proc.stdout] if proc.returncode == 0 else []
    jobcomp = Path(env.get("LOCAL_SLURM_DIR", _default_dir(None))) / "log" / "jobcomp.txt"
    if jobcomp.exists():
        # Job ids restart at 1 after a fresh start; the newest record for the id wins.
        records = [ln for ln in jobcomp.read_text(errors="replace").splitlines() if ln.startswith(f"JobId={job_id} ")]
        candidates += records[-1:]
    for text in candidates:
        exit_m, state_m = _EXIT_RE.search(text), _STATE_RE.search(text)
        if exit_m and state_m:
            return state_m.group(1), int(exit_m.group(1)), int(exit_m.group(2))
    raise RuntimeError(f"no exit code known for job {job_id}: {proc.stderr.strip()}")


# Job states after which a job will not run again (a requeued job goes back to PENDING instead).
FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
    }
)


def wait_for_job(
    job_id: str | int, env: dict[str, str], timeout: float = 120.0, poll: float = 0.25
) -> tuple[str, int, int]:
    """Wait until a job has finished; return (JobState, exit code, signal) like job_exit_code."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state, code, sig = job_exit_code(job_id, env)
        except RuntimeError:
            state, code, sig = "UNKNOWN", -1, -1
        if state in FINISHED_STATES:
            return state, code, sig
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} still {state} after {timeout:.0f}s")
        time.sleep(poll)
