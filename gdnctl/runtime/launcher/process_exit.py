"""Ending a runtime process without the interpreter's teardown.

After a job's last line, CPython's shutdown clears every module and then the native libraries run their static
destructors (torch's and OpenMP's thread pools, gloo, vLLM's engine). On a 2-core CPU machine that took 3.2 s in a
vLLM rollout server after the trainer said shutdown, 1.2 s in the trainer rank and 0.6 s in torchrun's agent: every
rl job paid about 5 s between its last step and its exit, and each test that launches one paid it again. None of
it leaves anything another process reads: the kernel frees the memory, files and GPU contexts of a process that
exits.

Python's own exit work still runs, in the order the interpreter runs it: the atexit handlers, among them the
weakref finalizers libraries rely on (vLLM's engine client stops its engine-core processes there, multiprocessing
stops its daemonic children, logging flushes its handlers), then Python's standard streams are flushed, and then
the C library's, which hold what native code printed (os._exit skips C's exit(), which would flush them). Where a
thread that is not a daemon still runs, the interpreter would wait for it, so the process exits the ordinary way.
As at an ordinary exit, a stream that cannot be flushed turns a success into exit code 120.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_without_teardown(code: int) -> NoReturn:
    """Exit with `code` after the atexit handlers and a flush of stdout and stderr, skipping module teardown."""
    main = threading.main_thread()
    if threading.current_thread() is not main or any(
        thread.is_alive() and not thread.daemon and thread is not main for thread in threading.enumerate()
    ):
        sys.exit(code)
    atexit._run_exitfuncs()  # noqa: SLF001 - CPython's own exit path: the handlers run once, here
    flushed = True
    for stream in dict.fromkeys((sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)):
        if stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: what it held is lost, as at an ordinary exit
            flushed = False
    _flush_c_streams()
    os._exit(code if flushed or code != 0 else SHORT_WRITE_EXIT)


# CPython's exit code when flushing the standard streams fails at exit (Py_FinalizeEx).
SHORT_WRITE_EXIT = 120


def _flush_c_streams() -> None:
    """fflush(NULL): every C stdio stream of the process, where native code (a kernel compiler, a C++ library) left
    output buffered behind a pipe or a file."""
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to load by name here: nothing of it to flush
        pass
