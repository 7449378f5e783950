"""Run a job's script so that stopping gdnctl stops the whole job, and nothing of it outlives gdnctl.

`gdnctl launch` runs launch_local.sh, which execs torchrun, which starts each rank in a session of its own
(torch's elastic SubprocessHandler passes start_new_session), and the ranks start their data workers and
vLLM engines. A signal to gdnctl alone reached none of them: gdnctl died, torchrun and the ranks were
reparented to init and went on, holding the run dir's and the save dir's locks.

So the script runs in a session of its own too, and SIGTERM, SIGINT or SIGHUP to gdnctl becomes a SIGTERM to every
process group of the job's tree (found through /proc at that moment, before an exiting torchrun orphans its
ranks): torchrun and the ranks get it together. gdnctl then waits up to
STOP_GRACE_SECONDS for the processes of those groups to end (torchrun gives its ranks 30 s before it kills
them itself) and SIGKILLs what is left; a second signal kills at once. The flock locks the job held go with its
processes.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from gdnctl.errors import GdnctlError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_GRACE_SECONDS = 40.0  # beyond torchrun's own 30 s for its ranks, so torchrun is not killed mid-shutdown
POLL_SECONDS = 0.1
PROC = Path("/proc")


class JobStopped(GdnctlError):
    """gdnctl was asked to stop (a signal); it stopped what it ran and exits 128 + the signal's number."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


@contextmanager
def stop_requests() -> Iterator[list[int]]:
    """Record SIGTERM, SIGINT and SIGHUP (in order of arrival) instead of dying of them, for the duration."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # Python installs handlers there only
        yield received
        return

    def record(signum: int, _frame) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in STOP_SIGNALS}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every live process (zombies are done: they hold nothing)."""
    table = {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # ended while we looked
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def _tree_groups(root: int, table: dict[int, tuple[int, int]]) -> set[int]:
    """The process groups of `root` and every process descending from it."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    groups, stack = set(), [root]
    while stack:
        pid = stack.pop()
        if pid in table:
            groups.add(table[pid][1])
        stack.extend(children.get(pid, ()))
    return groups


def _signal_groups(groups: set[int], sig: int) -> None:
    for group in groups:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):  # the group is gone (or its id now names another user's)
            pass


def _group_exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):  # gone, or the id now names another user's group
        return False
    return True


def _live_members(groups: set[int]) -> int:
    if not PROC.is_dir():  # no /proc (macOS): count the groups that still have a process instead
        return sum(1 for group in groups if _group_exists(group))
    return sum(1 for _, group in _processes().values() if group in groups)


def _job_groups(process: subprocess.Popen) -> set[int]:
    own = {os.getpgrp()}  # never gdnctl's own group
    return ({process.pid} | (_tree_groups(process.pid, _processes()) if PROC.is_dir() else set())) - own


def _stop(process: subprocess.Popen, received: list[int], grace: float) -> str:
    """Stop the job's whole tree on the first of `received`; returns what happened, as a clause. SIGTERM whatever
    came: it is torchrun's own signal to stop its ranks, and processes a shell started in the background ignore
    SIGINT."""
    groups = _job_groups(process)
    count = _live_members(groups)
    _signal_groups(groups, signal.SIGTERM)
    started = time.monotonic()
    while time.monotonic() < started + grace and len(received) == 1:
        process.poll()  # reap the script, so that it does not count as live
        if process.returncode is None:  # a group a rank made after the first look, found through its live parent
            groups |= _job_groups(process)
        if _live_members(groups) == 0:
            process.wait()
            return f"was sent SIGTERM and all {count} of its processes ended within {time.monotonic() - started:.1f} s"
        time.sleep(POLL_SECONDS)
    left = _live_members(groups)
    _signal_groups(groups, signal.SIGKILL)
    process.wait()
    why = "on a second signal" if len(received) > 1 else f"after {grace:.0f} s"
    return f"was sent SIGTERM, and {left} of its {count} processes still ran {why} and were killed (SIGKILL)"


def _write(target: IO, chunk: bytes) -> None:
    try:
        descriptor = target.fileno()
    except (OSError, ValueError):  # an in-memory stream (a test's captured output)
        if hasattr(target, "buffer"):
            target.flush()
            target.buffer.write(chunk)
        else:
            target.write(chunk.decode(errors="replace"))
        return
    target.flush()
    view = memoryview(chunk)
    while view:
        view = view[os.write(descriptor, view) :]


def _copy(source: IO[bytes], targets: list[IO]) -> None:
    """Copy a pipe to each of `targets` as it arrives, until the job closes it."""
    for chunk in iter(lambda: os.read(source.fileno(), 65536), b""):
        for target in targets:
            try:
                _write(target, chunk)
            except (OSError, ValueError):  # a reader that went away (a closed terminal) stops neither job nor log
                pass
    source.close()


def _open_log(path: Path) -> IO[bytes]:
    """The log, appended to, never through a link planted at its name."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644), "ab")


def _tee(process: subprocess.Popen, stdout: IO | None, log: IO) -> list[threading.Thread]:
    """Threads (in gdnctl, not processes of the job's tree) that copy the job's stdout and stderr to where they
    would have gone and to `log`."""
    import sys

    threads = [
        threading.Thread(target=_copy, args=(process.stdout, [stdout or sys.stdout, log]), daemon=True),
        threading.Thread(target=_copy, args=(process.stderr, [sys.stderr, log]), daemon=True),
    ]
    for thread in threads:
        thread.start()
    return threads


def run_job(
    argv: list[str], cwd: Path, stdout: IO | None = None, grace: float = STOP_GRACE_SECONDS, log: Path | None = None
) -> int:
    """Run `argv` in its own session and return its exit code; on SIGTERM, SIGINT or SIGHUP stop its whole
    process tree (see the module's docstring) and raise JobStopped. `log`: a file that gets a copy of the job's
    output as well (`gdnctl logs` reads it), appended to."""
    with stop_requests() as received, _open_log(log) if log is not None else _nothing() as log_file:
        pipe = subprocess.PIPE if log_file is not None else None
        process = subprocess.Popen(argv, cwd=cwd, stdout=pipe if pipe else stdout, stderr=pipe, start_new_session=True)
        copiers = _tee(process, stdout, log_file) if log_file is not None else []
        while not received:
            try:
                code = process.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                continue
            for copier in copiers:
                copier.join()
            return code
        name = signal.Signals(received[0]).name
        outcome = _stop(process, received, grace)
        raise JobStopped(
            f"stopped by {name}: the job ({shlex.join(argv)} and every process it started) {outcome}; "
            f"its run dir is {cwd}.",
            received[0],
        )
