"""Where a kernel compiler's own output goes: a log file in the kernel cache, not the user's terminal.

TileLang logs INFO lines through a handler that writes to sys.stdout, Python prints compiler warnings to
sys.stderr, and the compilers TileLang drives (TVM's C++ passes, nvcc) write to file descriptors 1 and 2
directly. A cold FlashQLA compile prints hundreds of such lines and, amid them, nothing of gdnctl's.
`capture_compiler_output` points fds 1 and 2 at `<cache>/gdnctl-compile.log` for the duration (fd-level, so C
code is caught too) and hands back a `CompileConsole` that keeps the terminal: `console.reporter(progress)` runs
gdnctl's own progress callback with sys.stdout and sys.stderr on copies of the original descriptors.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

COMPILE_LOG_NAME = "gdnctl-compile.log"
CACHE_ENV = "TILELANG_CACHE_DIR"
# TileLang 0.1.15's own default (tilelang/env.py) when TILELANG_CACHE_DIR is unset; gdnctl's commands and rendered
# scripts always set the variable, so this only matters for a runtime started by hand.
TILELANG_DEFAULT_CACHE = "~/.tilelang/cache"

Progress = Callable[[str], None]


def kernel_cache_dir() -> Path:
    """The directory TileLang caches compiled kernels in, as this process's environment sets it."""
    return Path(os.path.expanduser(os.environ.get(CACHE_ENV) or TILELANG_DEFAULT_CACHE))


def cached_kernel_files(directory: Path) -> int:
    """Files under a kernel cache, the compile log aside: a cache that holds only the log is still cold."""
    if not directory.is_dir():
        return 0
    return sum(1 for path in directory.rglob("*") if path.is_file() and path.name != COMPILE_LOG_NAME)


@dataclass
class CompileConsole:
    """The terminal while the compiler's output is captured; `log_path` None when the log could not be opened."""

    log_path: Path | None
    stdout: TextIO
    stderr: TextIO
    note: str  # one line for the user: where the compiler's output went

    def reporter(self, progress: Progress | None) -> Progress | None:
        """`progress` with sys.stdout and sys.stderr on the terminal while it runs, so that what it prints
        (typer.echo, print, a logger writing to sys.stderr) reaches the user and not the log."""
        if progress is None:
            return None

        def report(text: str) -> None:
            with contextlib.redirect_stdout(self.stdout), contextlib.redirect_stderr(self.stderr):
                progress(text)

        return report


@contextlib.contextmanager
def capture_compiler_output(cache_dir: Path, header: str) -> Iterator[CompileConsole]:
    """Append everything written to fds 1 and 2 to `<cache_dir>/gdnctl-compile.log` under a header line.

    A log that cannot be opened (a read-only cache) leaves the output where it was: losing the compiler's messages
    or stopping a job over a log file would both be worse than the noise.
    """
    log_path = cache_dir / COMPILE_LOG_NAME
    try:
        log = _open_log(log_path, header)
    except OSError as error:
        yield CompileConsole(
            None,
            sys.stdout,
            sys.stderr,
            f"compiler output stays on this console: cannot write {log_path} ({error.strerror})",
        )
        return
    with log, _descriptors_to(log.fileno()) as (stdout, stderr):
        yield CompileConsole(log_path, stdout, stderr, f"compiler output goes to {log_path}")


def _open_log(path: Path, header: str) -> TextIO:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Append mode is O_APPEND, which the descriptors dup'ed from it share: ranks writing one log do not overwrite
    # each other's lines.
    log = path.open("a", encoding="utf-8")
    log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {header} (pid {os.getpid()}) =====\n")
    log.flush()
    return log


@contextlib.contextmanager
def _descriptors_to(target: int) -> Iterator[tuple[TextIO, TextIO]]:
    """fds 1 and 2 point at `target`; yields text streams on what they were."""
    _flush_python_streams()
    saved = (os.dup(1), os.dup(2))
    terminal = tuple(os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace") for fd in saved)
    os.dup2(target, 1)
    os.dup2(target, 2)
    try:
        yield terminal
    finally:
        # Whatever Python buffered during the capture was written then, so it belongs in the log.
        _flush_python_streams()
        for fd, original in zip((1, 2), saved, strict=True):
            os.dup2(original, fd)
            os.close(original)
        for stream in terminal:
            stream.close()


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
