"""Reading the files a preset, a run dir or a job points at, within bounds and of the shape their readers use; a
sentence for an OSError; names made safe for a terminal (`printable`); the process's umask; temporary files that a
stop signal does not leave behind (`removed_when_stopped`).

A path gdnctl is given can name a FIFO (opening it blocks until a writer comes), a device (/dev/zero never
ends) or a file far larger than its format ever is: read as is, each hangs or takes the machine's memory.
`read_regular` opens without blocking, refuses what is not a regular file and reads no more than the bound
the caller gives. Decoding failures (bad UTF-8, JSON or YAML, nesting deeper than the parser's recursion) come
back as the same exception, one clause naming the file, so each caller adds its fix and raises its own error.

That is the one path for every file gdnctl did not just write itself (a preset, a run dir's records, a checkpoint
a resume starts from, a dataset, a tokenizer's files): read_regular, read_text, read_json or read_jsonl (one JSON
value a line, each line bounded) to get the content, then `typed` to check it has the shape the reader goes on to
use, so that a wrong type is a sentence naming the file and the field rather than a KeyError or a TypeError
later. JSON is decoded in one place (decode_json), which also refuses what Python's json module accepts but
nothing after it can use: nesting deeper than MAX_JSON_DEPTH (json.dumps, pickle and pydantic recurse and would
fail further on), integers of more than 4,300 digits, and escapes of lone UTF-16 surrogates (a str that cannot be
encoded, which tokenizers and every writer refuse).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

MIB = 1024**2
# Deeper than any file gdnctl reads ever nests (a config.json 3 levels, a trainer_state.json 3, a smoke report 4),
# and well inside what Python's recursion limit (1,000 frames) leaves json.dumps, pickle and pydantic.
MAX_JSON_DEPTH = 64
# Python's json decodes "\\ud800" into a str holding a lone surrogate; only such an escape can put one there.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# pydantic names the model a dict must fit ("a valid dictionary or instance of ManifestResolved"): gdnctl's own.
_PYDANTIC_CLASS = re.compile(r" or instance of \w+")


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


def open_regular(path: str | Path) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at `path` (links followed) and its stat; UnreadableFile otherwise."""
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
    except OSError as error:
        os.close(descriptor)
        raise UnreadableFile(f"{path} cannot be read ({_reason(error)})") from None
    if not stat.S_ISREG(info.st_mode):
        os.close(descriptor)
        raise UnreadableFile(f"{path} is {_kind(info.st_mode)}, not a regular file")
    return descriptor, info


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (links followed); UnreadableFile otherwise."""
    descriptor, info = open_regular(path)
    try:
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
    return decode_json(read_text(path, limit), str(path))


def decode_json(text: str | bytes, where: str, *, one_line: bool = False) -> Any:
    """The JSON value in `text`, or UnreadableFile with a clause that starts with `where` (a file, or a file and
    line): invalid JSON, bytes that are not UTF-8, nesting deeper than MAX_JSON_DEPTH, an integer too long to
    convert, or a lone surrogate escape."""
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError as error:
            raise UnreadableFile(f"{where} is not UTF-8 text (byte {error.start} cannot be decoded)") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        at = f"column {error.colno}" if one_line else f"line {error.lineno} column {error.colno}"
        raise UnreadableFile(f"{where} is not valid JSON ({error.msg} at {at})") from None
    except RecursionError:
        raise UnreadableFile(f"{where} nests its JSON deeper than a reader can follow") from None
    except ValueError:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
        raise UnreadableFile(
            f"{where} is not usable JSON (it holds an integer of more than {sys.get_int_max_str_digits():,} digits)"
        ) from None
    _check_decoded(value, where, surrogates=_SURROGATE_ESCAPE.search(text) is not None)
    return value


def _check_decoded(value: Any, where: str, *, surrogates: bool) -> None:
    """Walk a decoded JSON value (without recursion) for nesting past MAX_JSON_DEPTH and, when the text had such
    an escape, strings holding a lone surrogate."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children = [*item.keys(), *item.values()]
        elif isinstance(item, list):
            children = item
        else:
            found = _SURROGATE.search(item) if surrogates and isinstance(item, str) else None
            if found is not None:
                raise UnreadableFile(
                    f"{where} holds a lone surrogate escape ({ascii(found.group())[1:-1]}), which is no Unicode "
                    "character"
                )
            continue
        if depth > MAX_JSON_DEPTH:
            raise UnreadableFile(
                f"{where} nests its JSON deeper than a reader can follow (more than {MAX_JSON_DEPTH} levels)"
            )
        pending.extend((child, depth + 1) for child in children)


def read_jsonl(path: str | Path, line_limit: int) -> Iterator[tuple[int, Any]]:
    """(line number, JSON value) of every line of a regular file of one JSON value a line, blank lines skipped,
    read a line at a time (so a file of any length takes the memory of its longest line): UnreadableFile naming
    the file and line for a line longer than `line_limit` bytes or one decode_json refuses."""
    descriptor, _ = open_regular(path)
    with os.fdopen(descriptor, "rb") as stream:
        number = 0
        while True:
            number += 1
            try:
                line = stream.readline(line_limit + 1)
            except OSError as error:
                raise UnreadableFile(f"{path} cannot be read at line {number} ({_reason(error)})") from None
            if not line:
                return
            if len(line) > line_limit:
                raise UnreadableFile(
                    f"{path} line {number} is longer than {_size(line_limit)}, longer than a record is"
                )
            if line.strip():  # a blank line (an editor's trailing one, say) holds no record
                yield number, decode_json(line, f"{path} line {number}", one_line=True)


@functools.cache
def _adapter(shape: Any):
    from pydantic import TypeAdapter

    return TypeAdapter(shape)


def typed(value: Any, shape: Any, where: str) -> Any:
    """`value` (decoded JSON or YAML) checked against `shape`, a type (a pydantic model, dict[str, int], a union
    ...), strictly: a number is no string and a string no number. UnreadableFile with a clause that starts with
    `where` and names the first field that does not fit and what it should be."""
    from pydantic import ValidationError

    try:
        return _adapter(shape).validate_python(value, strict=True)
    except ValidationError as error:
        problems = error.errors(include_url=False)
        # The deepest place is the most precise; a union gives one error per member there: it could be any of them.
        field = max((_field_path(value, problem) for problem in problems), key=len)
        said = list(
            dict.fromkeys(
                _PYDANTIC_CLASS.sub("", problem["msg"]) for problem in problems if _field_path(value, problem) == field
            )
        )
        what = f"its {'.'.join(field)}" if field else "its content"
        prefix = "Input should be "
        if all(message.startswith(prefix) for message in said):
            told = f"{what} should be {' or '.join(message.removeprefix(prefix) for message in said)}"
        else:
            told = f"{what}: {'; '.join(message[:1].lower() + message[1:] for message in said)}"
        raise UnreadableFile(f"{where} does not have the expected shape: {told}") from None


def _field_path(value: Any, problem: Any) -> list[str]:
    """The place in `value` a pydantic error is about, without the names pydantic gives a union's members."""
    path, current = [], value
    for index, part in enumerate(problem["loc"]):
        if _holds(current, part):
            current = current[part]
        elif not (problem["type"] == "missing" and index == len(problem["loc"]) - 1):
            continue  # a union member's name (str, list[...], none)
        path.append(str(part))
    return path


def _holds(container: Any, part: Any) -> bool:
    """Whether `part` names an entry of `container` (a key of a dict, an index of a list)."""
    if isinstance(container, dict):
        return part in container
    return isinstance(container, list) and isinstance(part, int) and 0 <= part < len(container)


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


def current_umask() -> int:
    """This process's umask, read without changing it: Linux shows it in /proc/self/status (since 4.7); elsewhere
    it is set and put back at once, which another thread creating a file just then could see."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
        with removed_when_stopped(Path(temporary)):
            os.fchmod(descriptor, mode)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(text)
            os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# The signals whose default action ends a process without Python unwinding (torchrun's and Slurm's SIGTERM on a
# cancel, a requeue or a time limit; a closed terminal's SIGHUP). SIGINT raises KeyboardInterrupt, which a writer's
# own `except BaseException` already sees.
_ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def removed_when_stopped(temporary: Path) -> Iterator[None]:
    """Within the block, a stop signal removes `temporary` and then ends the process by that same signal (so
    torchrun and the shell report what they did before), rather than leaving a half-written `.name.tmp` beside a
    checkpoint for nobody, or only the next save of the same file, to remove. Python runs the handler between two
    bytecodes of the main thread, so a write in C (torch.save's zip writer) finishes its call first; only the
    main thread may set handlers, so elsewhere this does nothing; a signal with a handler of its own keeps it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        temporary.unlink(missing_ok=True)
        signal.signal(signum, signal.SIG_DFL)
        # A signal a thread sends itself is delivered before the call returns: the default action ends the process
        # here. The exit is for the case nothing else ever reaches.
        signal.pthread_kill(threading.get_ident(), signum)
        os._exit(128 + signum)

    taken = [sig for sig in _ENDING_SIGNALS if signal.getsignal(sig) is signal.SIG_DFL]
    for sig in taken:
        signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig in taken:
            signal.signal(sig, signal.SIG_DFL)


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


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with what a terminal would act on written out as escapes: control characters (ESC starts a
    terminal's escape sequences, CR rewrites the line), format characters (right-to-left overrides), lone
    surrogates (a file name that is not UTF-8, which a UTF-8 stream cannot even write). For names that come from
    the file system or from another user's job, on their way to the terminal."""
    return "".join(
        char if char.isprintable() or (keep_newlines and char in "\n\t") else ascii(char)[1:-1] for char in text
    )
