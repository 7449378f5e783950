"""gdnctl/runtime/launcher/process_exit.py: a runtime process ends with its code after Python's exit work (atexit
handlers, the streams flushed), without the interpreter's teardown; with a non-daemon thread still running it exits
the ordinary way, after that thread."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # each case starts a Python process


def _run(body: str) -> subprocess.CompletedProcess:
    """`body` in a fresh Python whose stdout and stderr are pipes, buffered as a job's are (PYTHONUNBUFFERED would
    make Python's and the C library's streams write through and hide a lost buffer)."""
    script = "import atexit, sys, threading, time\nfrom gdnctl.runtime.launcher import exit_without_teardown\n"
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    return subprocess.run(
        [sys.executable, "-c", script + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_the_code_the_atexit_handlers_and_the_buffered_output_survive():
    done = _run(
        """
        atexit.register(lambda: print("handler ran", flush=True))
        sys.stdout.write("buffered line\\n")  # no flush: the exit must write it
        sys.stderr.write("buffered error\\n")

        class Teardown:
            def __del__(self):
                print("module teardown ran", flush=True)

        keep = Teardown()  # a module global: only the interpreter's teardown would collect it
        exit_without_teardown(3)
        """
    )
    assert done.returncode == 3
    assert done.stdout.splitlines() == ["buffered line", "handler ran"]
    assert done.stderr == "buffered error\n"


def test_a_running_non_daemon_thread_is_waited_for_as_the_interpreter_would():
    done = _run(
        """
        def work():
            time.sleep(0.5)
            print("thread finished", flush=True)

        threading.Thread(target=work).start()
        exit_without_teardown(0)
        """
    )
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["thread finished"]


def test_what_native_code_printed_into_a_pipe_is_flushed_too():
    done = _run(
        """
        import ctypes

        libc = ctypes.CDLL(None)
        libc.printf(b"from C\\n")  # stdout is a pipe: the C library holds the line in its buffer
        exit_without_teardown(0)
        """
    )
    assert done.returncode == 0
    assert done.stdout.splitlines() == ["from C"]
