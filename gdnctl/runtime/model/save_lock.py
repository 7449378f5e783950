"""One running job per checkpoint directory: rank 0 holds an exclusive lock on `save_dir/.gdnctl-lock` for the
job's lifetime, so a second job pointed at the same train.save_dir (a copy-pasted preset, a relaunch while the
first still runs) stops with a sentence instead of interleaving its checkpoints with the first's.

flock(2) locks go with the process: a job that is killed or requeued releases its lock, and the requeued start
takes it again and resumes. Lustre (mounted with -o flock) and NFSv4 honour them across nodes.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from pathlib import Path
from typing import IO

from gdnctl.errors import GdnctlError

LOCK_FILE = ".gdnctl-lock"
# The locks this process holds: the rl job and the Megatron trainer it builds both ask for the save dir, and a
# second flock from one process on a new descriptor would conflict with the first.
_HELD: dict[Path, IO[str]] = {}


class SaveDirInUse(GdnctlError):
    """Another running job writes checkpoints into this save dir."""


class UnsafeLockFile(GdnctlError):
    """The lock file's name holds a link or something else than a file, which gdnctl will not write through."""


def _open_lock_file(path: Path) -> IO[str]:
    """The lock file, opened for reading and writing without following a link planted at its name: the holder's
    line is written over its content, which would truncate whatever file a link there points to."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise UnsafeLockFile(
                f"the save dir's lock file {path} cannot be opened ({error.strerror}); fix its "
                "permissions, or give this run another train.save_dir."
            ) from None
        raise UnsafeLockFile(
            f"the save dir's lock file {path} is a symbolic link, which gdnctl does not write "
            f"through (it would truncate what the link points to); remove the link (rm {path}) "
            "and start the job again."
        ) from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise UnsafeLockFile(
            f"the save dir's lock file {path} is not a regular file; remove it and start the job again."
        )
    return os.fdopen(descriptor, "r+")


def hold_save_dir(save_dir: Path, run_dir: Path) -> IO[str]:
    """Lock `save_dir` for this job (keep the returned file open for as long as the job runs)."""
    key = save_dir.resolve()
    if key in _HELD and not _HELD[key].closed:
        return _HELD[key]
    save_dir.mkdir(parents=True, exist_ok=True)
    handle = _open_lock_file(save_dir / LOCK_FILE)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a job that did not say which"
        handle.close()
        raise SaveDirInUse(
            f"train.save_dir {save_dir} is in use by another running job ({holder}); two jobs "
            "writing one checkpoint directory would overwrite each other's checkpoints. Give this "
            "run its own train.save_dir, or stop the other job first."
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"run dir {run_dir}, host {socket.gethostname()}, pid {os.getpid()}\n")
    handle.flush()
    _HELD[key] = handle
    return handle
