"""Durable writes: every file of a checkpoint under its real name is whole and on disk (a temporary name, fsync, rename,
fsync of the directory), and the checksums a resume checks them against.

A write that fails, or that a stop signal (a cancel's SIGTERM) cuts short, leaves nothing behind under either name:
the temporary file is removed, and the name keeps what it held (for `latest`, the last complete checkpoint). A full
disk or quota is one sentence naming the directory and its free space, whichever writer met it: safetensors reports
it as a SafetensorError, torch.save as a RuntimeError ("unexpected pos ..." from its zip writer), plain writes as
OSError 28 or 122.

Every file of a checkpoint follows the process's umask (0644 under the usual 022), as the directories do:
safetensors' own writer creates its file 0600, which would keep a team from reading, or serving, each other's
weights.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from gdnctl.files import current_umask, removed_when_stopped
from gdnctl.runtime.model.checkpoint_layout import CHECKSUM, STATE_CHECKSUM, CheckpointError


def write_file(path: Path, write: Callable[[Path], object], durable: bool = True) -> dict:
    """Write `path` whole or not at all: `write(temporary)` fills a temporary file in the same directory (so the
    rename cannot cross file systems), which is fsynced and renamed over `path`, and then the directory is
    fsynced so that the rename itself survives a power loss. Returns the file's size and checksum (size only
    when not `durable`). The temporary name is fixed, so a save that a crash interrupted is cleaned up by the
    next save of the same file rather than left behind."""
    temporary = path.with_name(f".{path.name}.tmp")
    _claim_temporary(temporary)
    try:
        with removed_when_stopped(temporary), _full_disk_is_a_sentence(path.parent):
            write(temporary)
            os.chmod(temporary, FILE_MODE & ~current_umask())
            record = _sync_and_describe(temporary) if durable else {"size": temporary.stat().st_size}
            os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_directory(path.parent)
    return record


# What a new file gets before the umask (open(2)'s and Python's default for files).
FILE_MODE = 0o666
# How each writer says that a write found the disk (or the quota) full. torch.save's zip writer says only that a
# write came up short ("unexpected pos 704 vs 598"), which is a full disk when the disk has (next to) no room left.
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_MESSAGES = re.compile(r"No space left on device|Disk quota exceeded|os error (28|122)\b")
_SHORT_WRITE = re.compile(r"unexpected pos \d+ vs \d+")
_NO_ROOM_BYTES = 16 * 1024**2


def _free_bytes(directory: Path) -> int | None:
    try:
        stats = os.statvfs(directory)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def _full_disk(error: BaseException, directory: Path) -> bool:
    for link in (error, error.__cause__, error.__context__):
        if isinstance(link, OSError) and link.errno in _FULL_ERRNOS:
            return True
        if link is not None and _FULL_MESSAGES.search(str(link)):
            return True
    free = _free_bytes(directory)
    return bool(_SHORT_WRITE.search(str(error))) and free is not None and free < _NO_ROOM_BYTES


@contextmanager
def _full_disk_is_a_sentence(directory: Path) -> Iterator[None]:
    """CheckpointError naming `directory` and its free space for a write that found the disk or quota full."""
    try:
        yield
    except Exception as error:
        if not _full_disk(error, directory):
            raise
        free_bytes = _free_bytes(directory)
        free = f"{free_bytes / 1024**2:,.1f} MiB free there" if free_bytes is not None else "its free space unknown"
        raise CheckpointError(
            f"the disk holding {directory} is full (or the quota there is used up; {free}), so this checkpoint "
            "could not be written; its partial files were removed and save_dir/latest still names the last "
            "complete checkpoint. Free space there, or point train.save_dir at a filesystem with room, and resume."
        ) from None


def _claim_temporary(temporary: Path) -> None:
    """Create `temporary` as a new, empty file of this save. What a crashed save left there (a regular file) is
    removed first; a link there is refused, never written through: the writers below open the name and would
    truncate the file it points to. `latest` and the checkpoint's files themselves are safe from links: os.replace
    renames over a link, it does not follow it."""
    if temporary.is_symlink() or (temporary.exists() and not temporary.is_file()):
        raise CheckpointError(
            f"{temporary} is a symbolic link or not a regular file, which gdnctl does not write "
            f"through (it would overwrite what it points to); remove it (rm {temporary}) and "
            "start the job again."
        )
    temporary.unlink(missing_ok=True)
    try:
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    except FileExistsError:  # created between the check and the open: by another writer, so not this save's
        raise CheckpointError(
            f"{temporary} appeared while this save was writing it: another job writes into "
            f"{temporary.parent}; give each job its own train.save_dir."
        ) from None


def _sync_and_describe(path: Path) -> dict:
    with path.open("rb") as handle:
        # Hashed before the fsync: the hash reads the page cache while the kernel is already writing back.
        # Linux flushes a file's dirty pages through any descriptor of it, a read-only one too.
        digest = hashlib.file_digest(handle, CHECKSUM).hexdigest()
        os.fsync(handle.fileno())
        return {"size": os.fstat(handle.fileno()).st_size, CHECKSUM: digest}


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def make_directory(directory: Path) -> None:
    """mkdir -p, each new directory's entry fsynced in its parent (a checkpoint whose directory entry is lost
    in a crash would take its files with it)."""
    created = [path for path in (directory, *directory.parents) if not path.exists()]
    with _full_disk_is_a_sentence(next((path for path in directory.parents if path.exists()), Path("/"))):
        directory.mkdir(parents=True, exist_ok=True)
    for path in created:
        _fsync_directory(path.parent)


def write_json(path: Path, document: dict, durable: bool = True) -> dict:
    text = json.dumps(document, indent=2) + "\n"
    return write_file(path, lambda temporary: temporary.write_text(text), durable)


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], durable: bool) -> dict:
    from safetensors.torch import save_file

    return write_file(path, lambda temporary: save_file(tensors, str(temporary), metadata={"format": "pt"}), durable)


def document_checksum(document: dict) -> str:
    """sha256 of a JSON document's keys other than its own checksum, serialized canonically."""
    content = {key: value for key, value in document.items() if key != STATE_CHECKSUM}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def file_checksum(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, CHECKSUM).hexdigest()
