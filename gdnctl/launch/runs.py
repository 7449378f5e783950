"""What a run dir says about its job, for `gdnctl status`, `logs`, `cancel` and `runs`.

Nothing is recorded beyond what the run dir already holds: manifest.json (the preset, how it is launched, the Slurm
job name), the Slurm job ids `launch --slurm` records, the lock launch_local.sh holds while a local job runs, how
the latest local run ended (.gdnctl-local-exit.json, which `gdnctl launch` writes as it ends), and the logs in
logs/ (a Slurm job's logs/JOB_NAME-JOBID.out, a local run's logs/local-*.out). Slurm itself answers for a Slurm
job's state; a job slurmctld has forgotten is reported as such.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gdnctl.errors import GdnctlError
from gdnctl.launch import run_dir as run_dirs
from gdnctl.launch import submit
from gdnctl.launch.render import slurm_job_name
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
        if self.local_exit is not None:
            ended = self.local_exit.describe()
        else:
            ended = f", exit code {self.exit_code}" if self.exit_code is not None else ""
        job = f" (Slurm job {self.job_ids[-1]})" if self.job_ids else ""
        return f"{self.run_dir}: {self.name} ({self.job}, {self.executor}) {self.state}{job}{ended}"


def manifest(run_dir: Path) -> dict:
    """The run dir's manifest, or NotARunDir with what to pass instead."""
    if not run_dir.is_dir():
        raise NotARunDir(
            f"{run_dir} is not a directory; pass a run dir that `gdnctl render` or `gdnctl launch` "
            "wrote (gdnctl runs lists those under runs/)."
        )
    found = run_dirs.read_manifest(run_dir)
    if found is None:
        raise NotARunDir(
            f"{run_dir} is not a gdnctl run dir (no manifest.json of gdnctl's in it); pass a run dir "
            "that `gdnctl render` or `gdnctl launch` wrote (gdnctl runs lists those under runs/)."
        )
    return found


def launch_facts(run_dir: Path) -> tuple[str, str]:
    """(executor, Slurm job name) of a run dir, from its manifest."""
    return _launch(manifest(run_dir))


def _launch(found: dict) -> tuple[str, str]:
    """(executor, Slurm job name); run dirs rendered before the manifest recorded them: local, and the name."""
    launch = found.get("launch")
    if not isinstance(launch, dict):
        launch = {}
    resolved = found.get("resolved")
    name = str((resolved.get("name") if isinstance(resolved, dict) else None) or "gdnctl")
    return str(launch.get("executor") or "local"), str(launch.get("job_name") or slurm_job_name(name))


def slurm_log(run_dir: Path, job_name: str, job_id: str) -> Path:
    return run_dir / run_dirs.LOGS / f"{job_name}-{job_id}.out"


def latest_local_log(run_dir: Path) -> Path | None:
    logs = sorted((run_dir / run_dirs.LOGS).glob("local-*.out")) if (run_dir / run_dirs.LOGS).is_dir() else []
    return logs[-1] if logs else None


def status(run_dir: Path) -> RunStatus:
    found = manifest(run_dir)
    executor, job_name = _launch(found)
    resolved = found.get("resolved") or {}
    result = RunStatus(run_dir, str(resolved.get("name", "?")), str(resolved.get("job", "?")), executor, "rendered")
    result.job_ids = run_dirs.recorded_slurm_jobs(run_dir)
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
    if found.log is None or not found.log.is_file():
        if found.job_ids:
            raise NotARunDir(
                f"Slurm job {found.job_ids[-1]} of {run_dir} has not written its log {found.log} yet "
                f"(it is {found.state}); try again once it starts."
            )
        raise NotARunDir(
            f"{run_dir} has no log yet: it has not been launched (gdnctl launch PRESET --run-dir {run_dir})."
        )
    return found.log


def cancel(run_dir: Path) -> list[str]:
    """scancel every job recorded in the run dir that has not ended; returns their ids. A local job is stopped
    where it runs (Ctrl-C, or a signal to its gdnctl), so it gets a sentence saying so."""
    manifest(run_dir)
    job_ids = run_dirs.recorded_slurm_jobs(run_dir)
    if not job_ids:
        if run_dirs.locked(run_dir):
            raise NotARunDir(
                f"{run_dir} runs here as a local job, which stops with the gdnctl that launched it: "
                "press Ctrl-C there, or send it SIGTERM (it stops every process of the job)."
            )
        raise NotARunDir(f"{run_dir} has no Slurm job to cancel (none was submitted from it).")
    unfinished = [job_id for job_id, _ in submit.unfinished_jobs(job_ids)]
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
