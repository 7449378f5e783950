"""grpo.reward: {function: ...}: the user's function called in a pool of worker processes, one sample per call.

grpo.reward_workers processes (each a fresh interpreter, `python -m gdnctl.runtime.rl.rewards.worker`, so nothing
of the trainer's torch or CUDA state is forked into them) each import the function once (worker.py) and then score
one sample per request, over a multiprocessing.connection pipe. A thread of the trainer's rank 0 drives each
worker: it takes the next submitted sample, sends it, and waits at most grpo.reward.timeout_s for the answer. A
worker that does not answer in time is killed and replaced, and one that dies (a crash, SIGKILL at the hard CPU
limit) is replaced; either way that call fails, and the failure goes with its sample (scoring.py applies
grpo.reward.on_error). Samples are scored as soon as they are submitted, while the loop goes on generating or
decoding the others.

The pool starts before the trainer builds its model: an import that fails, a missing name or an object that is
not callable stops the job there with a sentence, before any GPU is used.
"""

from __future__ import annotations

import queue
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

from gdnctl.runtime.rl.rewards import worker
from gdnctl.runtime.rl.rewards.results import Collector, RewardRequest, RewardResult
from gdnctl.runtime.rl.user_code import UserCodeError, describe
from gdnctl.schema import EngineRewardFunction

# How long a worker may take to start and import the function; generous, since an import may load a library.
START_SECONDS = 120.0
# How long close() waits for an idle worker to exit before it is killed.
EXIT_SECONDS = 5.0


class _Worker:
    """One worker process and its pipe; `call` gives a result whatever becomes of the process."""

    def __init__(self, spec: EngineRewardFunction) -> None:
        self._spec = spec
        self._code = spec.code.model_dump()
        self._memory = None if spec.memory_gib is None else int(spec.memory_gib * 2**30)
        self.process: subprocess.Popen | None = None
        self._pipe: Connection | None = None
        self.replaced = 0  # how many times this slot's worker was replaced

    def start(self) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", worker.__name__, str(theirs.fileno())], pass_fds=(theirs.fileno(),)
            )
        self._pipe = Connection(ours.detach())
        self._pipe.send((self._code, self._memory, self._spec.cpu_seconds))

    def ready(self) -> None:
        """Wait for the worker's import; UserCodeError with its sentence if the function cannot be called."""
        who = describe(self._code)
        if not self._pipe.poll(START_SECONDS):
            self.kill()
            raise UserCodeError(f"{who}: a reward worker did not finish importing it within {START_SECONDS:g} s.")
        try:
            message = self._pipe.recv()
        except EOFError:
            raise UserCodeError(
                f"{who}: a reward worker exited with code {self._exit_code()} while importing it (see the log "
                "above); fix the module, or raise grpo.reward.memory_gib if it needs more memory."
            ) from None
        if message[0] == "failed":
            self.kill()
            raise UserCodeError(message[1] if message[1].startswith(who) else f"{who}: {message[1]}.")

    def call(self, request: RewardRequest) -> tuple:
        """The worker's answer to one sample: ("ok", score, metrics, started, finished) or ("error", why, ...)."""
        sent = time.time()
        try:
            self._pipe.send(request.payload())
            answered = self._pipe.poll(self._spec.timeout_s)
            if answered:
                return self._pipe.recv()
        except (EOFError, OSError):
            failed, code = time.time(), self._exit_code()
            self._replace()
            return ("error", f"its worker process died (exit code {code}) and was replaced", sent, failed)
        failed = time.time()
        self._replace()
        return (
            "error",
            f"it did not return within {self._spec.timeout_s:g} s (grpo.reward.timeout_s); its worker was killed "
            "and replaced",
            sent,
            failed,
        )

    def _exit_code(self) -> int | None:
        if self.process is None:
            return None
        try:
            return self.process.wait(1.0)
        except subprocess.TimeoutExpired:
            return None

    def _replace(self) -> None:
        self.kill()
        self.replaced += 1
        self.start()
        self.ready()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()
        if self._pipe is not None:
            self._pipe.close()

    def stop(self) -> None:
        """Ask an idle worker to exit; kill it if it does not."""
        try:
            self._pipe.send(None)
        except OSError:
            pass
        try:
            self.process.wait(EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


class FunctionPool(Collector):
    """The user's function in grpo.reward_workers processes: `submit` one sample, `collect` the scores."""

    kind = "function"

    def __init__(self, spec: EngineRewardFunction) -> None:
        super().__init__()
        self.spec = spec
        self.who = describe(spec.code)
        self._workers = [_Worker(spec) for _ in range(spec.workers)]
        for slot in self._workers:  # all start at once, each importing the function
            slot.start()
        try:
            for slot in self._workers:
                slot.ready()
        except BaseException:
            self.close()
            raise
        self._queue: queue.Queue = queue.Queue()
        self._threads = [
            threading.Thread(target=self._drive, args=(slot,), name="gdnctl-reward-pool", daemon=True)
            for slot in self._workers
        ]
        for thread in self._threads:
            thread.start()

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids now (a replaced worker has a new one)."""
        return [slot.process.pid for slot in self._workers]

    @property
    def replaced(self) -> int:
        return sum(slot.replaced for slot in self._workers)

    def submit(self, request: RewardRequest) -> None:
        self._queue.put((self._ticket(), request, time.time()))

    def _drive(self, slot: _Worker) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            ticket, request, submitted = item
            try:
                answer = slot.call(request)
            except UserCodeError as error:  # the replacement could not import the function any more
                self._fail(error)
                return
            if answer[0] == "ok":
                _, score, metrics, started, finished = answer
                result = RewardResult(score, metrics, None, submitted, started, finished)
            else:
                _, why, started, finished = answer
                result = RewardResult(self.spec.default_score, {}, why, submitted, started, finished)
            self._deliver(ticket, result)

    def close(self) -> None:
        for _ in getattr(self, "_threads", ()):
            self._queue.put(None)
        for thread in getattr(self, "_threads", ()):
            thread.join(self.spec.timeout_s + EXIT_SECONDS)
        for slot in self._workers:
            if slot.process is not None:
                slot.stop()
