"""Run a rendered run dir: locally with bash, or on Slurm with sbatch (optionally following the job)."""

from __future__ import annotations

import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from gdnctl.errors import GdnctlError
from gdnctl.launch import run_dir as run_dirs
from gdnctl.launch.process_tree import JobStopped, run_job, stop_requests
from gdnctl.schema import LOCAL_EXIT_FILE, LocalExit

TERMINAL_STATES = {
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
POLL_SECONDS = 1.0


class SubmitError(GdnctlError):
    pass


def default_run_dir(name: str, root: Path = Path("runs")) -> Path:
    """runs/NAME-YYYYMMDD-HHMMSS-XXXX: readable, sorted by time, and apart for launches in the same second (the
    four random hex digits; render also creates the run dir exclusively and draws again on a collision)."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64] or "run"
    return root / f"{safe}-{stamp}-{secrets.token_hex(2)}"


def local_log(run_dir: Path, args: tuple[str, ...] = ()) -> Path:
    """logs/local-YYYYMMDD-HHMMSS[-smoke].out: where a local run's output is copied (`gdnctl logs` reads it)."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return run_dir / run_dirs.LOGS / f"local-{stamp}{'-smoke' if args else ''}.out"


def run_local(run_dir: Path, args: tuple[str, ...] = (), stdout: IO | None = None) -> int:
    """Run launch_local.sh (with `args`, e.g. --smoke) on this process's stderr and on `stdout`, by default this
    process's stdout, with a copy of both in logs/local-*.out; returns the run's exit code, 128 + N when signal N
    ended it. SIGTERM, SIGINT or SIGHUP stop the job's whole process tree and raise JobStopped
    (process_tree.run_job). Either way the run dir records how the run ended (run_dir.record_local_exit)."""
    log = local_log(run_dir, args)
    run_dirs.refuse_link(log.parent)
    log.parent.mkdir(exist_ok=True)
    run_dirs.forget_local_exit(run_dir)
    smoke = bool(args)
    try:
        code = run_job(["bash", str(run_dir / "launch_local.sh"), *args], run_dir, stdout, log=log)
    except JobStopped as stopped:
        _record_exit(run_dir, stopped.exit_code, signal.Signals(stopped.signum).name, smoke=smoke, stopped=True)
        raise
    killed_by = None
    if code < 0:
        # Popen's -N: signal N ended the launcher itself (launch_local.sh execs it), an OOM kill or someone's kill;
        # reported as a shell reports it, and as Slurm's ExitCode is read (job_status).
        killed_by, code = _signal_name(-code), 128 - code
    _record_exit(run_dir, code, killed_by, smoke=smoke)
    return code


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name in the enum
        return f"signal {number}"


def _record_exit(run_dir: Path, exit_code: int, signal_name: str | None, *, smoke: bool, stopped: bool = False) -> None:
    """Record how the local run ended; a run dir that cannot take the record gets a sentence on stderr, and the run's
    exit code stands."""
    record = LocalExit(
        exit_code=exit_code,
        signal=signal_name,
        stopped=stopped,
        smoke=smoke,
        ended_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    try:
        run_dirs.record_local_exit(run_dir, record)
    except OSError as error:
        print(
            f"gdnctl: the run ended with exit code {exit_code}, but gdnctl could not record it in "
            f"{run_dir / LOCAL_EXIT_FILE} ({error.strerror or error}), so `gdnctl status` will not show it.",
            file=sys.stderr,
        )


@dataclass
class SlurmJob:
    job_id: str
    state: str | None = None
    exit_code: int | None = None


def _require(command: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise SubmitError(
            f"{command} is not on PATH: install the Slurm client (Debian: slurm-client) on this "
            "host, or launch without --slurm to run locally."
        )
    return path


def check_sbatch() -> None:
    """`launch --slurm`, before it writes the run dir: a host without sbatch gets the sentence and no run dir."""
    try:
        _require("sbatch")
    except SubmitError as error:
        raise SubmitError(f"{error} Nothing was written.") from None


def submit(run_dir: Path, args: tuple[str, ...] = ()) -> SlurmJob:
    """sbatch the run dir's script; `args` go to the script (--smoke, --smoke-then-run)."""
    sbatch = _require("sbatch")
    proc = subprocess.run(
        [sbatch, "--parsable", "launch_slurm.sbatch", *args], cwd=run_dir, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        reason = (proc.stderr or proc.stdout).strip().splitlines()
        raise SubmitError(
            f"sbatch rejected the job: {reason[-1] if reason else f'exit {proc.returncode}'}. "
            f"The script is {run_dir / 'launch_slurm.sbatch'}."
        )
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SubmitError(f"sbatch did not print a job id (got {proc.stdout.strip()!r}).")
    run_dirs.record_slurm_job(run_dir, job_id)
    return SlurmJob(job_id)


def unfinished_jobs(job_ids: list[str]) -> list[tuple[str, str]]:
    """(job id, state) of each of `job_ids` that squeue still knows and that has not ended (pending, running,
    suspended, requeued ...): a job that may still read its run dir."""
    squeue = shutil.which("squeue")
    if squeue is None:
        raise SubmitError(
            f"Slurm job(s) {', '.join(job_ids)} were submitted from this run dir and squeue is not on "
            "PATH to tell whether they have ended; run this where the Slurm client is installed, or "
            "choose another run dir."
        )
    unfinished = []
    for job_id in job_ids:
        proc = subprocess.run(
            [squeue, "--noheader", "--states=all", "--format=%T", "--jobs", job_id],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:  # slurmctld no longer knows it: it ended long ago
                continue
            reason = (proc.stderr or proc.stdout).strip().splitlines()
            raise SubmitError(
                f"squeue could not say whether Slurm job {job_id}, submitted from this run dir, has "
                f"ended ({reason[-1] if reason else f'exit {proc.returncode}'}); try again when "
                "slurmctld answers, or choose another run dir."
            )
        state = proc.stdout.strip().split()
        if state and state[0] not in TERMINAL_STATES:
            unfinished.append((job_id, state[0]))
    return unfinished


def job_status(job_id: str) -> tuple[str | None, int | None]:
    """(state, exit code) from scontrol; the exit code is known once the job has ended."""
    scontrol = _require("scontrol")
    proc = subprocess.run([scontrol, "-o", "show", "job", job_id], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None, None
    state = re.search(r"\bJobState=(\S+)", proc.stdout)
    code = re.search(r"\bExitCode=(\d+):(\d+)", proc.stdout)
    exit_code = None
    if code:
        status, signal = int(code.group(1)), int(code.group(2))
        exit_code = status if status else (128 + signal if signal else 0)
    return (state.group(1) if state else None), exit_code


def job_nodes(job_id: str) -> str | None:
    """The Slurm host list (`node-[1-2]`) a job runs on; None while it has none (pending, or forgotten)."""
    proc = subprocess.run(
        [_require("scontrol"), "-o", "show", "job", job_id], capture_output=True, text=True, check=False
    )
    found = re.search(r"\bNodeList=(\S+)", proc.stdout) if proc.returncode == 0 else None
    return found.group(1) if found and found.group(1) != "(null)" else None


# sinfo's long state names of a node Slurm holds failed: down, failing or drained (after "Kill task failed", say);
# a trailing `*` means the node does not answer, whatever its state.
_FAILED_NODE_STATES = ("down", "fail", "drain")


def failed_nodes(nodelist: str) -> list[tuple[str, str, str]]:
    """(node, state, Slurm's reason) of each node of `nodelist` that Slurm holds failed now."""
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return []
    proc = subprocess.run(
        [sinfo, "--noheader", "--Node", f"--nodes={nodelist}", "--format=%N|%T|%E"],
        capture_output=True,
        text=True,
        check=False,
    )
    failed = []
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        if state.endswith("*") or state.startswith(_FAILED_NODE_STATES):
            failed.append((name, state, reason.strip()))
    return list(dict.fromkeys(failed))


def node_failure_sentence(job_id: str, failed: list[tuple[str, str, str]], requeued: bool, run_dir: Path) -> str:
    """What a node failure did to the job, naming the node(s)."""
    nodes = "; ".join(
        f"{name} ({reason or 'no reason given'}; Slurm holds it {state})" for name, state, reason in failed
    )
    what = f"node{'s' if len(failed) > 1 else ''} {nodes} of job {job_id} failed"
    if requeued:
        return (
            f"{what}; Slurm requeued the job (--requeue), which starts again from its last checkpoint once it "
            f"has nodes (gdnctl cancel {run_dir} stops it)."
        )
    return (
        f"{what}, so Slurm ended the job on every node; what it saved stays in train.save_dir, and "
        f"`gdnctl resume {run_dir} --slurm` runs it again from its last checkpoint."
    )


# The sentence each node's launcher prints for its failed rank (gdnctl/runtime/launcher/torchrun.py
# failure_sentence), and the line that starts each run of the script (a requeued job appends to the same log).
_FAILED_RANK = re.compile(r"^gdnctl: the job failed: (rank \d+ .+?)\. The rank's own message", re.MULTILINE)
_RUN_STARTS = re.compile(r"^gdnctl: job \d+ on \d+ node\(s\)", re.MULTILINE)
_LOG_TAIL_BYTES = 1 << 20


def first_failure(log: Path) -> str | None:
    """The first failed rank that the log's last run names ("rank 1 on NODE exited with code 3"): across nodes
    the rank that failed first, whose node's task srun's --kill-on-bad-exit then stopped the others for (the job's
    exit code is srun's, the highest of its tasks': 143 for a stopped one). None when the log names none."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - _LOG_TAIL_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    starts = list(_RUN_STARTS.finditer(text))
    found = _FAILED_RANK.search(text, starts[-1].start() if starts else 0)
    return found.group(1) if found else None


def follow(
    run_dir: Path, job: SlurmJob, job_name: str, echo: Callable[[str], None], poll: float = POLL_SECONDS
) -> SlurmJob:
    """Tail the job's log until it ends; the job's exit code lands in `job.exit_code`. SIGTERM, SIGINT or
    SIGHUP stop the following, not the job (it belongs to Slurm now), and raise JobStopped saying so."""
    with stop_requests() as received:
        return _follow(run_dir, job, job_name, echo, poll, received)


def _follow(
    run_dir: Path, job: SlurmJob, job_name: str, echo: Callable[[str], None], poll: float, received: list[int]
) -> SlurmJob:
    log = run_dir / "logs" / f"{job_name}-{job.job_id}.out"
    offset = 0

    def drain() -> None:
        nonlocal offset
        if not log.exists():
            return
        with log.open("rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
        offset += len(chunk)
        if chunk:
            echo(chunk.decode(errors="replace").rstrip("\n"))

    last_state = None
    nodes = None  # the nodes of the job's current run: which of them failed, if it stops running
    while True:
        if received:
            name = signal.Signals(received[0]).name
            raise JobStopped(
                f"stopped following Slurm job {job.job_id} on {name}; the job goes on (scancel "
                f"{job.job_id} stops it) and its log is {log}.",
                received[0],
            )
        state, exit_code = job_status(job.job_id)
        drain()
        if state != last_state and state is not None:
            print(f"gdnctl: job {job.job_id} is {state}", file=sys.stderr)
            last_state = state
            if state == "RUNNING":
                nodes = job_nodes(job.job_id)
            elif nodes is not None and state in ("NODE_FAIL", "PENDING", "REQUEUED"):
                # A node lost mid-job: Slurm ends the job NODE_FAIL, or requeues it (--requeue).
                failed = failed_nodes(nodes)
                if failed:
                    sentence = node_failure_sentence(job.job_id, failed, state != "NODE_FAIL", run_dir)
                    print(f"gdnctl: {sentence}", file=sys.stderr)
                nodes = None
        if state in TERMINAL_STATES:
            drain()
            job.state = state
            job.exit_code = exit_code if exit_code is not None else 1
            if state != "COMPLETED" and job.exit_code == 0:
                job.exit_code = 1  # cancelled or timed out jobs can report 0:0; they did not succeed
            return job
        if state is None:
            raise SubmitError(f"scontrol no longer knows job {job.job_id}; its log is {log}.")
        time.sleep(poll)
