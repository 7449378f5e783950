"""What a run dir says about its job, for `gdnctl status`, `logs`, `cancel` and `runs`.

Nothing is recorded beyond what the run dir already holds: manifest.json (the preset, how it is launched, the Slurm
job name), the Slurm job ids `launch --slurm` records, the lock launch_local.sh holds while a local job runs, how
the latest local run ended (.gdnctl-local-exit.json, which `gdnctl launch` writes as it ends), and the logs in
logs/ (a Slurm job's logs/JOB_NAME-JOBID.out, a local run's logs/local-*.out). Slurm itself answers for a Slurm
job's state; a job slurmctld has forgotten is reported as such.

A recorded Slurm job id is only acted on (its state reported, its log followed, the job cancelled) once Slurm
confirms that the job was submitted from this run dir under its job name (submit.confirm_jobs): a run dir copied
with `cp -r` carries the original's ids, and a cluster whose ids started over gives them to other jobs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gdnctl.errors import GdnctlError
from gdnctl.files import printable
from gdnctl.launch import run_dir as run_dirs
from gdnctl.launch import submit
from gdnctl.launch.log_tail import LogTail
from gdnctl.schema import LocalExit


class NotARunDir(GdnctlError):
    pass


@dataclass
class RunStatus:
    run_dir: Path
    name: str
    job: str
    executor: str
    state: str  # rendered | running | ended | PENDING, RUNNING, COMPLETED ... (Slurm's) | unknown
    job_ids: list[str] = field(default_factory=list)
    exit_code: int | None = None
    log: Path | None = None
    note: str = ""
    local_exit: LocalExit | None = None  # how the latest local run ended, when it has ended and gdnctl recorded it

    def to_json(self) -> dict:
        local = self.local_exit
        return {
            "run_dir": str(self.run_dir),
            "name": self.name,
            "job": self.job,
            "executor": self.executor,
            "state": self.state,
            "slurm_job_ids": self.job_ids,
            "exit_code": self.exit_code,
            "outcome": local.outcome if local else None,
            "signal": local.signal if local else None,
            "smoke": local.smoke if local else None,
            "log": str(self.log) if self.log else None,
            "note": self.note,
        }

    def line(self) -> str:
        """One line for the terminal: the run dir's path and its preset's name are anybody's text, so what a
        terminal would act on in them (escape sequences, a carriage return) is written out as escapes."""
        if self.local_exit is not None:
            ended = self.local_exit.describe()
        else:
            ended = f", exit code {self.exit_code}" if self.exit_code is not None else ""
        job = f" (Slurm job {self.job_ids[-1]})" if self.job_ids else ""
        return printable(f"{self.run_dir}: {self.name} ({self.job}, {self.executor}) {self.state}{job}{ended}")


def manifest(run_dir: Path) -> dict:
    """The run dir's manifest, or NotARunDir with what to pass instead."""
    if not run_dir.is_dir():
        raise NotARunDir(
            f"{run_dir} is not a directory; pass a run dir that `gdnctl render` or `gdnctl launch` "
            "wrote (gdnctl runs lists those under runs/)."
        )
    try:
        return run_dirs.load_manifest(run_dir)
    except run_dirs.NotGdnctlsManifest as error:
        raise NotARunDir(
            f"{run_dir} is not a gdnctl run dir ({error}); pass a run dir that `gdnctl render` or "
            "`gdnctl launch` wrote (gdnctl runs lists those under runs/), or render it again."
        ) from None


def launch_facts(run_dir: Path) -> tuple[str, str]:
    """(executor, Slurm job name) of a run dir, from its manifest."""
    return run_dirs.launch_facts(manifest(run_dir))


def own_slurm_jobs(run_dir: Path, job_name: str) -> tuple[list[str], list[submit.KnownJob]]:
    """The Slurm job ids the run dir records, and those of them slurmctld knows, each confirmed to be this run
    dir's (submit.ForeignSlurmJob otherwise)."""
    job_ids = run_dirs.recorded_slurm_jobs(run_dir)
    return job_ids, (submit.confirm_jobs(run_dir, job_name, job_ids) if job_ids else [])


def slurm_log(run_dir: Path, job_name: str, job_id: str) -> Path:
    return run_dir / run_dirs.LOGS / f"{job_name}-{job_id}.out"


def latest_local_log(run_dir: Path) -> Path | None:
    logs = sorted((run_dir / run_dirs.LOGS).glob("local-*.out")) if (run_dir / run_dirs.LOGS).is_dir() else []
    return logs[-1] if logs else None


def check_as_rendered(run_dir: Path) -> None:
    """Refuse (NotARunDir) a run dir whose engine.yaml or scripts are not what gdnctl rendered there: `resume` runs
    them as they are, and an edit could bring back what validate refuses (an environment variable LCH002 forbids
    in engine.yaml's env, another rollout.python) with nothing checking it."""
    differ = run_dirs.differing_files(run_dir, run_dirs.listed_files(manifest(run_dir)))
    if differ:
        named = ", ".join(str(run_dir / name) for name in differ)
        raise NotARunDir(
            f"{named} {'is' if len(differ) == 1 else 'are'} not what gdnctl rendered (manifest.json records "
            "another sha256, or none), and resume would run it as it is; restore it, or move your copy out of "
            "the run dir and render it again (gdnctl render PRESET -o RUN_DIR --force, which validates the preset "
            "and keeps the checkpoints, logs and metrics there), then resume."
        )


def check_path_is_text(run_dir: Path) -> None:
    """Refuse (NotARunDir) to start a job in a run dir whose path is not UTF-8 text (a name of bytes another
    system wrote, as `cp -r` or an archive keeps it): the job's libraries take paths as text, and TensorBoard's
    event writer stopped the first step there with UnicodeEncodeError."""
    path = str(run_dir.absolute())
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise NotARunDir(
            f"the run dir {printable(path)} has a path that is not UTF-8 text, where the job's libraries cannot "
            "write (TensorBoard's event writer fails at the first step); rename it, or the directory holding it, "
            "to a UTF-8 name (mv), then run it again."
        ) from None


def status(run_dir: Path) -> RunStatus:
    found = manifest(run_dir)
    executor, job_name = run_dirs.launch_facts(found)
    resolved = found.get("resolved") or {}
    result = RunStatus(run_dir, str(resolved.get("name", "?")), str(resolved.get("job", "?")), executor, "rendered")
    result.job_ids, _ = own_slurm_jobs(run_dir, job_name)
    if result.job_ids:
        job_id = result.job_ids[-1]
        result.executor = "slurm"
        result.log = slurm_log(run_dir, job_name, job_id)
        state, exit_code = submit.job_status(job_id)
        if state is None:
            result.state = "unknown"
            result.note = f"slurmctld no longer knows job {job_id} (it ended a while ago); its log is {result.log}."
        else:
            result.state = state
            result.exit_code = exit_code if state in submit.TERMINAL_STATES else None
        return result
    result.log = latest_local_log(run_dir)
    if run_dirs.locked(run_dir):
        result.state = "running"
        return result
    ended = run_dirs.read_local_exit(run_dir)
    if ended is not None:
        result.state, result.local_exit, result.exit_code = "ended", ended, ended.exit_code
    elif run_dirs.job_traces(run_dir, run_dirs.listed_files(found)):
        result.state = "ended"
        if result.log is not None:
            result.note = (
                "no exit code was recorded for it (the gdnctl that launched it ended before the job, or "
                "predates the record); its log says how it ended."
            )
    return result


def log_path(run_dir: Path) -> Path:
    """The log of the run dir's latest job, or NotARunDir saying why there is none."""
    found = status(run_dir)
    if found.log is None or not os.path.lexists(found.log):
        if found.job_ids:
            raise NotARunDir(
                f"Slurm job {found.job_ids[-1]} of {run_dir} has not written its log {found.log} yet "
                f"(it is {found.state}); try again once it starts."
            )
        raise NotARunDir(
            f"{run_dir} has no log yet: it has not been launched (gdnctl launch PRESET --run-dir {run_dir})."
        )
    return found.log


def print_log(run_dir: Path, write: Callable[[str], None], *, follow: bool, poll: float = submit.POLL_SECONDS) -> None:
    """Hand `write` the log of the run dir's latest job a chunk at a time (log_tail.py); with `follow`, wait for a
    queued Slurm job's log to appear and keep going as it grows, until the job ends."""
    if follow:  # a queued Slurm job has no log yet: wait for it to start (or end) rather than give up
        while True:
            found = status(run_dir)
            if (
                (found.log is not None and os.path.lexists(found.log))
                or not found.job_ids
                or found.state in ("unknown", *submit.TERMINAL_STATES)
            ):
                break
            time.sleep(poll)
    tail = LogTail(log_path(run_dir))
    tail.drain(write, final=not follow)
    while follow:
        ended = status(run_dir).state in ("ended", "unknown", *submit.TERMINAL_STATES)
        tail.drain(write, final=ended)  # after the end: what the job wrote between the last read and its end
        if ended:
            return
        time.sleep(poll)


def cancel(run_dir: Path) -> list[str]:
    """scancel every job recorded in the run dir that has not ended; returns their ids. A local job is stopped
    where it runs (Ctrl-C, or a signal to its gdnctl), so it gets a sentence saying so."""
    job_ids, known = own_slurm_jobs(run_dir, launch_facts(run_dir)[1])
    if not job_ids:
        if run_dirs.locked(run_dir):
            raise NotARunDir(
                f"{run_dir} runs here as a local job, which stops with the gdnctl that launched it: "
                "press Ctrl-C there, or send it SIGTERM (it stops every process of the job)."
            )
        raise NotARunDir(f"{run_dir} has no Slurm job to cancel (none was submitted from it).")
    unfinished = [job.job_id for job in known if job.state not in submit.TERMINAL_STATES]
    if unfinished:
        scancel = shutil.which("scancel")
        if scancel is None:
            raise submit.SubmitError("scancel is not on PATH: run this where the Slurm client is installed.")
        proc = subprocess.run([scancel, *unfinished], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            reason = (proc.stderr or proc.stdout).strip().splitlines()
            raise submit.SubmitError(
                f"scancel {' '.join(unfinished)} failed: {reason[-1] if reason else f'exit {proc.returncode}'}."
            )
    return unfinished


def find_runs(root: Path) -> list[Path]:
    """The run dirs directly under `root` (runs/ by default), oldest first by name (their names carry the time)."""
    if not root.is_dir():
        return []
    return sorted(
        entry
        for entry in root.iterdir()
        if entry.is_dir() and not entry.is_symlink() and run_dirs.read_manifest(entry) is not None
    )


def listed_status(run_dir: Path) -> RunStatus:
    """status() for `gdnctl runs`, where one run dir that cannot say (a record gdnctl did not write, a job that is
    not its own, squeue not answering) is listed with the sentence instead of ending the listing."""
    try:
        return status(run_dir)
    except GdnctlError as error:
        found = run_dirs.read_manifest(run_dir) or {}
        executor, _ = run_dirs.launch_facts(found) if found else ("?", "")
        resolved = found.get("resolved") or {}
        return RunStatus(
            run_dir, str(resolved.get("name", "?")), str(resolved.get("job", "?")), executor, "unknown", note=str(error)
        )
