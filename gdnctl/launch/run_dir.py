"""What in a run dir is gdnctl's, and whether a job still uses it.

gdnctl renders four files into a run dir (RENDERED), and its manifest.json lists them with their sha256
(`files`). Everything else there is the job's or yours: logs, metrics, TensorBoard events, checkpoints, W&B
offline runs, a run dir nested inside; `render --force` replaces the listed files and nothing else.

A job holds its run dir while it runs. launch_local.sh takes an flock on LOCK_FILE before it execs torchrun,
which keeps the descriptor, so the lock lasts exactly as long as the job; `--force` takes the same lock while it
replaces the files. `gdnctl launch --slurm` records each job id it submits in SLURM_JOBS_FILE, so that `--force`
can ask squeue whether the job has ended: a queued job would read the new engine.yaml when it starts. When a local
job ends, `gdnctl launch` records how in LOCAL_EXIT_FILE (schema/local_exit.py) for `gdnctl status`.

Nothing here follows a symbolic link: a run dir given as a link, and a link planted as the lock file or the job
record, are refused with a sentence naming the path. Nothing here blocks or takes the machine's memory either:
what gdnctl reads back (the manifest, the job record, the local exit record, the listed files it hashes) goes
through files.py's bounded reads, which refuse a FIFO, a device or a file larger than gdnctl ever writes there.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from gdnctl.errors import GdnctlError
from gdnctl.files import MIB, UnreadableFile, read_json, read_regular, typed
from gdnctl.schema import LOCAL_EXIT_FILE, MANIFEST_FILE, LocalExit, RunManifest

MANIFEST = MANIFEST_FILE
RENDERED = ("engine.yaml", "launch_local.sh", "launch_slurm.sbatch", MANIFEST)
LOGS = "logs"
LOCK_FILE = ".gdnctl-run.lock"  # not save_lock's .gdnctl-lock: a save_dir may be the run dir itself
SLURM_JOBS_FILE = ".gdnctl-slurm-jobs"
BOOKKEEPING = (LOCK_FILE, SLURM_JOBS_FILE, LOCAL_EXIT_FILE)
# A local exit record is a few hundred bytes; one past this is not gdnctl's.
MAX_LOCAL_EXIT_BYTES = 64 * 1024
# A manifest holds the resolved preset and its findings (tens of KiB); the scripts and engine.yaml a few KiB; the
# job record a line per submission. Past these, what is there is not gdnctl's.
MAX_MANIFEST_BYTES = 16 * MIB
MAX_RENDERED_BYTES = 16 * MIB
MAX_SLURM_JOBS_BYTES = 1 * MIB


class RunDirNotEmpty(GdnctlError):
    pass


class RunDirTaken(RunDirNotEmpty):
    """A default run dir name another launch took first (render draws another)."""


class RunDirInUse(RunDirNotEmpty):
    pass


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise RunDirNotEmpty(
            f"{path} is a symbolic link (to {os.readlink(path)}); gdnctl never renders through a "
            f"link, which would replace what it points to: pass the directory itself "
            f"({path.resolve()}), or remove the link."
        )


def _open(path: Path, flags: int) -> int:
    """os.open without following a link at `path` and without blocking (a FIFO there would wait for its other end);
    a link, or anything but a regular file, is refused."""
    try:
        descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise RunDirNotEmpty(
                f"{path} is a symbolic link; gdnctl does not write through links in a run dir: "
                f"remove it (rm {path}) and run again."
            ) from None
        raise RunDirNotEmpty(
            f"{path} cannot be opened ({error.strerror}); fix its permissions, or choose another run dir."
        ) from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise RunDirNotEmpty(f"{path} is not a regular file; remove it and run again.")
    return descriptor


class NotGdnctlsManifest(GdnctlError):
    """What is at RUN_DIR/manifest.json is not a manifest gdnctl wrote: one clause saying why."""


def load_manifest(run_dir: Path) -> dict:
    """The manifest.json that gdnctl writes into every run dir it renders, with the fields its readers use of the
    types they use them as (schema/manifest.py); NotGdnctlsManifest saying why otherwise."""
    path = run_dir / MANIFEST
    if path.is_symlink():  # a link is not a manifest gdnctl wrote, whatever it points to
        raise NotGdnctlsManifest(f"{path} is a symbolic link")
    if not os.path.lexists(path):
        raise NotGdnctlsManifest(f"{path} does not exist")
    try:
        manifest = read_json(path, MAX_MANIFEST_BYTES)
        typed(manifest, RunManifest, str(path))
    except UnreadableFile as error:
        raise NotGdnctlsManifest(str(error)) from None
    return manifest


def slurm_job_name(name: str) -> str:
    """The Slurm job name of a preset's name: the scripts' #SBATCH --job-name and the logs' logs/NAME-JOBID.out."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64] or "gdnctl"


def launch_facts(manifest: dict) -> tuple[str, str]:
    """(executor, Slurm job name) of a manifest load_manifest checked; run dirs rendered before the manifest
    recorded them: local, and the name made from the preset's."""
    launch = manifest.get("launch") or {}
    name = str((manifest.get("resolved") or {}).get("name") or "gdnctl")
    return str(launch.get("executor") or "local"), str(launch.get("job_name") or slurm_job_name(name))


def read_manifest(run_dir: Path) -> dict | None:
    """load_manifest's manifest; None where there is none of gdnctl's."""
    try:
        return load_manifest(run_dir)
    except NotGdnctlsManifest:
        return None


def file_sha256(path: Path) -> str | None:
    """sha256 of a rendered file at `path`, read within bounds and without following a link; None where there is
    no regular file of a rendered file's size (a link, a FIFO, a directory, something else)."""
    if path.is_symlink():
        return None
    try:
        return sha256(read_regular(path, MAX_RENDERED_BYTES))
    except UnreadableFile:
        return None


def manifest_files(files: dict[str, str]) -> list[dict]:
    """The manifest's `files`: each rendered file with its sha256, and manifest.json itself."""
    return [*({"path": name, "sha256": sha256(text.encode())} for name, text in files.items()), {"path": MANIFEST}]


def listed_files(manifest: dict) -> dict[str, str | None]:
    """name -> sha256 (None: not recorded) of the files `manifest` says gdnctl wrote. Only the names gdnctl
    renders count, so an edited manifest cannot point --force at anything else; manifests written before the
    list existed name the four files."""
    entries = manifest.get("files")
    if not isinstance(entries, list):
        return dict.fromkeys(RENDERED)
    listed: dict[str, str | None] = {}
    for entry in entries:
        if isinstance(entry, dict) and entry.get("path") in RENDERED:
            listed[entry["path"]] = entry.get("sha256") if isinstance(entry.get("sha256"), str) else None
    listed.setdefault(MANIFEST, None)
    return listed


def edited_files(run_dir: Path, listed: dict[str, str | None], new: dict[str, str]) -> list[str]:
    """Listed files whose content is neither what gdnctl wrote nor what it is about to write: someone's edits."""
    edited = []
    for name, recorded in listed.items():
        path = run_dir / name
        if recorded is None or not os.path.lexists(path):
            continue
        current = file_sha256(path)
        if current is None:  # a link or no regular file: replaced by a rename, never written through
            continue
        if current != recorded and (name not in new or current != sha256(new[name].encode())):
            edited.append(name)
    return edited


def differing_files(run_dir: Path, listed: dict[str, str | None]) -> list[str]:
    """The listed files that are not as gdnctl wrote them: missing, replaced by a link or something else than a
    file, or of another sha256 than the manifest records (manifest.json itself records none)."""
    return [
        name
        for name, recorded in listed.items()
        if name != MANIFEST and (recorded is None or file_sha256(run_dir / name) != recorded)
    ]


def kept_entries(run_dir: Path, listed: dict[str, str | None]) -> list[str]:
    """The entries of `run_dir` that --force leaves as they are: all but the listed files, gdnctl's bookkeeping
    and an empty logs/ (directories end in /)."""
    kept = []
    for entry in sorted(os.scandir(run_dir), key=lambda entry: entry.name):
        is_dir = entry.is_dir(follow_symlinks=False)
        if entry.name in listed or entry.name in BOOKKEEPING or entry.name.startswith(".gdnctl-rendering-"):
            continue
        if entry.name == LOGS and is_dir and not any(os.scandir(entry.path)):
            continue
        kept.append(entry.name + ("/" if is_dir else ""))
    return kept


def locked(run_dir: Path) -> bool:
    """Whether a job holds the run dir's lock now (launch_local.sh's flock, or --force replacing the files)."""
    path = run_dir / LOCK_FILE
    if path.is_symlink() or not path.is_file():
        return False
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)
    return False


def job_traces(run_dir: Path, listed: dict[str, str | None]) -> list[str]:
    """What shows that a job has used the run dir: anything beside gdnctl's files and an empty logs/ (metrics,
    checkpoints, logs), a recorded local exit or Slurm job, or the lock while a job holds it. Empty: only rendered.
    The lock file alone is no trace: `render --force` creates it too, and a run dir it rendered over a fresh one
    must still launch as it is."""
    traces = kept_entries(run_dir, listed)
    traces += [name for name in BOOKKEEPING if name != LOCK_FILE and os.path.lexists(run_dir / name)]
    if locked(run_dir):
        traces.append(LOCK_FILE)
    return traces


@contextmanager
def hold(run_dir: Path) -> Iterator[None]:
    """Hold the run dir's lock for the duration, as a running job does; RunDirInUse when a job holds it."""
    path = run_dir / LOCK_FILE
    descriptor = _open(path, os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirInUse(
                f"{run_dir} is in use by a running job (launch_local.sh holds {path}); stop the job "
                "or wait for it to end, or choose another run dir."
            ) from None
        except OSError:  # a file system without flock: launch_local.sh then runs without the lock as well
            pass
        yield
    finally:
        os.close(descriptor)


def record_slurm_job(run_dir: Path, job_id: str) -> None:
    path = run_dir / SLURM_JOBS_FILE
    try:
        descriptor = _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except RunDirNotEmpty as error:
        raise RunDirNotEmpty(
            f"Slurm job {job_id} was submitted, but gdnctl could not record it, so --force will "
            f"not see that it runs: {error}"
        ) from None
    with os.fdopen(descriptor, "a") as handle:
        handle.write(job_id + "\n")


def recorded_slurm_jobs(run_dir: Path) -> list[str]:
    """The Slurm job ids submitted from this run dir, oldest first; RunDirNotEmpty for a record that is not one
    gdnctl wrote (a link, a FIFO, a directory, a file larger than any record)."""
    path = run_dir / SLURM_JOBS_FILE
    if not os.path.lexists(path):
        return []
    if path.is_symlink():
        raise RunDirNotEmpty(
            f"{path} is a symbolic link, not the record of Slurm jobs gdnctl keeps there; remove it (rm {path})."
        )
    try:
        text = read_regular(path, MAX_SLURM_JOBS_BYTES).decode(errors="replace")
    except UnreadableFile as error:
        raise RunDirNotEmpty(
            f"{error}, not the record of Slurm jobs gdnctl keeps there; remove it (rm -r {path})."
        ) from None
    return [job_id for job_id in dict.fromkeys(text.split()) if job_id.isdigit() and len(job_id) <= 20]


def record_local_exit(run_dir: Path, record: LocalExit) -> None:
    """Write `record` as the run dir's LOCAL_EXIT_FILE atomically and durably: a new file beside it, flushed to
    disk, renamed over the old one and the directory flushed, so that a crash or a full disk leaves the old record
    or the new, never part of one. The rename replaces a link planted at the name rather than writing through it.
    Raises OSError when the run dir cannot take it."""
    path = run_dir / LOCAL_EXIT_FILE
    temporary = run_dir / f"{LOCAL_EXIT_FILE}.{secrets.token_hex(4)}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(record.model_dump_json(indent=2) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    except OSError:  # a file system that cannot flush a directory (some network ones): the record is in place
        pass
    finally:
        os.close(directory)


def forget_local_exit(run_dir: Path) -> None:
    """Remove the record of an earlier local run as a new one starts, so that it never stands for the new one (a
    link at its name is removed, not followed)."""
    path = run_dir / LOCAL_EXIT_FILE
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        raise RunDirNotEmpty(
            f"{path} cannot be removed ({error.strerror}); gdnctl replaces it with how this run "
            f"ends: remove it (rm -r {path}) and launch again."
        ) from None


def read_local_exit(run_dir: Path) -> LocalExit | None:
    """How the run dir's latest local run ended; None where none was recorded, or what is there is not a record
    gdnctl wrote (a link, another kind of file, or text that does not parse as one)."""
    path = run_dir / LOCAL_EXIT_FILE
    if not os.path.lexists(path) or path.is_symlink():
        return None
    try:
        return LocalExit.model_validate_json(read_regular(path, MAX_LOCAL_EXIT_BYTES))
    except (UnreadableFile, ValidationError):
        return None
