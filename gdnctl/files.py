"""Reading the files a preset or a run dir points at, within bounds, and a sentence for an OSError.

A path gdnctl is given can name a FIFO (opening it blocks until a writer comes), a device (/dev/zero never
ends) or a file far larger than its format ever is: read as is, each hangs or takes the machine's memory.
`read_regular` opens without blocking, refuses what is not a regular file and reads no more than the bound
the caller gives. Decoding failures (bad UTF-8, JSON or YAML, nesting deeper than the parser's recursion) come
back as the same exception, one clause naming the file, so each caller adds its fix and raises its own error.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

MIB = 1024**2


class UnreadableFile(Exception):
    """Why a file cannot be used: one clause that starts with its path; the caller adds the fix."""


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a plain file")


def _size(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit >= MIB and limit % MIB == 0 else f"{limit:,} bytes"


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (links followed); UnreadableFile otherwise."""
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; it changes nothing for a file.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags)
    except FileNotFoundError:
        raise UnreadableFile(f"{path} does not exist") from None
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the path
        raise UnreadableFile(f"{path} cannot be opened ({_reason(error)})") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile(f"{path} is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise UnreadableFile(f"{path} is larger than {_size(limit)}, more than such a file ever is")
        with os.fdopen(descriptor, "rb", closefd=False) as stream:
            data = stream.read(limit + 1)  # it may have grown since fstat
    except OSError as error:
        raise UnreadableFile(f"{path} cannot be read ({_reason(error)})") from None
    finally:
        os.close(descriptor)
    if len(data) > limit:
        raise UnreadableFile(f"{path} is larger than {_size(limit)}, more than such a file ever is")
    return data


def read_text(path: str | Path, limit: int) -> str:
    data = read_regular(path, limit)
    try:
        return data.decode()
    except UnicodeDecodeError as error:
        raise UnreadableFile(f"{path} is not UTF-8 text (byte {error.start} cannot be decoded)") from None


def read_json(path: str | Path, limit: int) -> Any:
    text = read_text(path, limit)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise UnreadableFile(
            f"{path} is not valid JSON ({error.msg} at line {error.lineno} column {error.colno})"
        ) from None
    except RecursionError:
        raise UnreadableFile(f"{path} nests its JSON deeper than a reader can follow") from None
    except ValueError as error:  # an integer of more than 4,300 digits
        raise UnreadableFile(f"{path} is not usable JSON ({error})") from None


def read_yaml(path: str | Path, limit: int) -> Any:
    text = read_text(path, limit)
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise UnreadableFile(f"{path} is not valid YAML ({error.problem or error.context}{where})") from None
    except yaml.YAMLError as error:
        raise UnreadableFile(f"{path} is not valid YAML ({error})") from None
    except RecursionError:
        raise UnreadableFile(f"{path} nests its YAML deeper than a reader can follow") from None
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        # PyYAML's scalar constructors raise plain errors on some malformed scalars (`!!int x`, `0b_`)
        raise UnreadableFile(f"{path} is not valid YAML ({type(error).__name__}: {error})") from None


def write_text(path: Path, text: str) -> None:
    """Path.write_text whose OSError names the file: write() itself reports ENOSPC, EFBIG or EIO without it."""
    try:
        path.write_text(text)
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from None


def replace_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` atomically without following a link planted in the directory: the data goes into a
    new file of a random name (mkstemp: O_CREAT | O_EXCL, so no existing name, link or not, is ever opened), which
    then replaces `path` (rename replaces a link at `path` itself, never the file it points to)."""
    import tempfile

    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(descriptor, mode)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno is not None:
        name = errno.errorcode.get(error.errno)
        return f"{error.strerror or os.strerror(error.errno)}" + (f", {name}" if name else "")
    return str(error)


# What the machine can do about an OSError, by errno: these come from the filesystem or its limits, not from a
# bug in gdnctl, so they are told as a sentence rather than a traceback.
_FIXES = {
    errno.ENOSPC: "free space there or write elsewhere",
    errno.EDQUOT: "free space within your quota there or write elsewhere",
    errno.EFBIG: "the file is larger than the filesystem or `ulimit -f` allows; write elsewhere or raise the limit",
    errno.EROFS: "the filesystem is mounted read-only; write to a writable one",
    errno.EACCES: "check the permissions there or write elsewhere",
    errno.EPERM: "check the permissions there or write elsewhere",
    errno.EIO: "the device reported an I/O error; check the disk or write elsewhere",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.ELOOP: "a symbolic link on the way points back at itself; fix the link",
    errno.ENOTDIR: "a part of the path is a file, not a directory; choose another path",
    errno.EMFILE: "too many files are open in this process; raise `ulimit -n`",
    errno.ENFILE: "too many files are open on this machine; try again later",
}


def os_error_sentence(error: OSError) -> str | None:
    """One sentence naming the path and the fix for an OSError the machine caused (a full disk, a read-only
    filesystem, a file too large); None for any other (a bug, which deserves its traceback)."""
    fix = _FIXES.get(error.errno) if error.errno is not None else None
    if fix is None:
        return None
    path = error.filename if error.filename is not None else "a file"
    target = f" (to {error.filename2})" if error.filename2 is not None else ""
    return f"{path}{target}: {_reason(error)}; {fix}."
