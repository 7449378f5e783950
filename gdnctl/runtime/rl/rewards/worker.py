"""One worker process of the reward pool (pool.py): it imports the user's function once, then scores one sample per
request, under the preset's limits. Standard library only, so a worker starts in a fraction of a second.

Limits, set in this process before the user's code is imported:
- memory: RLIMIT_AS at grpo.reward.memory_gib, soft and hard (the function cannot raise it); past it an allocation
  fails, which Python raises as MemoryError, and the call fails;
- CPU: before each call the soft RLIMIT_CPU is set to the CPU time used so far plus grpo.reward.cpu_seconds; past
  it the kernel sends SIGXCPU (every second, until the hard limit's SIGKILL), which this process turns into an
  exception in the call, so the call fails and the worker goes on;
- wall clock: the pool's, per call (grpo.reward.timeout_s): a call that does not answer in time, however it
  hangs, gets its worker killed and replaced.
A worker also asks the kernel to kill it when the thread of the trainer that started it ends (PR_SET_PDEATHSIG),
so a function stuck in a loop cannot outlive the job.

`python -m gdnctl.runtime.rl.rewards.worker FD` runs it (pool.py starts it with the trainer's interpreter): a fresh
interpreter that imports this module and the user's, nothing of the trainer's torch or CUDA state, and whatever
way the trainer itself was started. FD is its end of a socket pair, carrying multiprocessing.connection's
messages: first (code, memory_bytes, cpu_seconds) from the pool; the worker answers ("ready", pid) or ("failed",
sentence), then each request (a dict of the function's keyword arguments) with ("ok", score, metrics, started,
finished) or ("error", why, started, finished); None asks it to exit.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import math
import os
import resource
import signal
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from gdnctl.runtime.rl.user_code import ScoreError, UserCodeError, load, raised, read_score

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class CpuLimitExceeded(Exception):
    """SIGXCPU arrived: the call used more CPU time than grpo.reward.cpu_seconds."""


class _Calling:
    """Whether the user's function is running: SIGXCPU raises only then (one arriving just after is moot)."""

    now = False


def _over_cpu(signum, frame) -> None:
    if _Calling.now:
        raise CpuLimitExceeded


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pool's close() and the pipe's EOF still end the worker
        pass


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def serve(connection: Connection) -> None:
    """The worker's life: limits, the import, then one call per request until None or the pipe closes."""
    _die_with_parent()
    try:
        code, memory_bytes, cpu_seconds = connection.recv()
    except EOFError:
        return
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    signal.signal(signal.SIGXCPU, _over_cpu)
    try:
        function = load(code)
    except UserCodeError as error:
        connection.send(("failed", str(error)))
        return
    except MemoryError:
        connection.send(("failed", f"importing it took more than grpo.reward.memory_gib ({memory_bytes} bytes)"))
        return
    if not callable(function):
        connection.send(("failed", f"{code['name']} is a {type(function).__name__}, not a function"))
        return
    connection.send(("ready", os.getpid()))
    soft_cpu, hard_cpu = resource.getrlimit(resource.RLIMIT_CPU)
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        if request is None:
            return
        if cpu_seconds is not None:
            limit = math.ceil(_cpu_used() + cpu_seconds)
            resource.setrlimit(
                resource.RLIMIT_CPU, (limit if hard_cpu == resource.RLIM_INFINITY else min(limit, hard_cpu), hard_cpu)
            )
        started = time.time()
        try:
            reply = _call(function, request, cpu_seconds, started)
        finally:
            if cpu_seconds is not None:
                resource.setrlimit(resource.RLIMIT_CPU, (soft_cpu, hard_cpu))
        connection.send(reply)


def _call(function, request: dict[str, Any], cpu_seconds: float | None, started: float) -> tuple:
    _Calling.now = True
    try:
        value = function(**request)
        if inspect.iscoroutine(value):
            value = asyncio.run(value)
        score, metrics = read_score(value)
    except CpuLimitExceeded:
        return (
            "error",
            f"it used more than {cpu_seconds:g} CPU seconds (grpo.reward.cpu_seconds)",
            started,
            time.time(),
        )
    except MemoryError:
        return ("error", "it ran out of memory (grpo.reward.memory_gib)", started, time.time())
    except ScoreError as error:
        return ("error", str(error), started, time.time())
    except BaseException as error:  # noqa: BLE001 - the user's function may raise anything, SystemExit too
        return ("error", f"it raised {raised(error)}", started, time.time())
    finally:
        _Calling.now = False
    return ("ok", score, metrics, started, time.time())


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
