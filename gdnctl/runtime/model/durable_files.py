"""Durable writes: every file of a checkpoint under its real name is whole and on disk (a temporary name, fsync,
rename, fsync of the directory), and the checksums a resume checks them against."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from gdnctl.runtime.model.checkpoint_layout import CHECKSUM, STATE_CHECKSUM, CheckpointError


def write_file(path: Path, write: Callable[[Path], object], durable: bool = True) -> dict:
    """Write `path` whole or not at all: `write(temporary)` fills a temporary file in the same directory (so the
    rename cannot cross file systems), which is fsynced and renamed over `path`, and then the directory is
    fsynced so that the rename itself survives a power loss. Returns the file's size and checksum (size only
    when not `durable`). The temporary name is fixed, so a save that a crash interrupted is cleaned up by the
    next save of the same file rather than left behind."""
    temporary = path.with_name(f".{path.name}.tmp")
    _claim_temporary(temporary)
    write(temporary)
    record = _sync_and_describe(temporary) if durable else {"size": temporary.stat().st_size}
    os.replace(temporary, path)
    if durable:
        _fsync_directory(path.parent)
    return record


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
