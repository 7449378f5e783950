"""Trainer rank 0's stream of requests to every engine it drives, on a thread of its own: requests go out as the
loop hands them over, each finished sample comes back to the loop's callback the moment an engine reports it, and an
engine that dies or stops making progress is started again, its requests sent again.

Used where trainer rank 0 drives every engine (rollout/engine_layout.py: every layout but colocated engines on
several nodes), so the stream needs no collective: the loop (runtime/rl/feed.py) keeps handing it requests while the
trainer trains.

Routing. A request goes to the engine with the fewest in flight among those serving recent enough weights: a
request carries the oldest weight version it may be generated under (its step's bound). An engine restarts on the
weights directory, which holds the current weights when the syncs go through it (rollout.weight_sync: disk) and the
first ones otherwise; one restarted behind the current version gets no request until the loop syncs the current
weights again (`behind`).

Failures. Every engine is asked for its finished samples several times a second, idle ones too. An engine has
failed when its server exits or breaks the connection, answers an error, does not answer a `collect` within
rollout.stall_timeout_s, or answers that it has had requests in flight without producing a token for that long. Its
server is stopped (what is left of it) and started again on the weights directory, and every request it had in
flight is sent again, from the start, with its own seed, up to rollout.max_engine_restarts over the job; one more
failure fails the job with its sentence.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gdnctl.runtime.rl.rollout.engines import RolloutEngines
from gdnctl.runtime.rl.rollout.protocol import RolloutError

# How long one `collect` waits on an engine for a finished sample: the latency with which a finished sample reaches
# the loop, against the polls an idle wait costs.
POLL_SECONDS = 0.2


@dataclass(frozen=True)
class Outgoing:
    """A request for the stream: its key (handed back with its result), the wire request (protocol
    REQUEST_FIELDS), and the oldest weight version it may be generated under."""

    key: Any
    request: dict
    min_version: int


class RolloutStream:
    def __init__(
        self,
        engines: RolloutEngines,
        *,
        on_finished: Callable[[Any, dict], None],
        weights: Callable[[], tuple[str, int]],
        max_restarts: int,
        stall_timeout_s: float,
        log: Callable[[str], None],
    ) -> None:
        """on_finished(key, result): called on the stream's thread for each finished request (result: the
        protocol's collect entry). weights(): (the weights directory, the version it holds), what a restarted engine
        starts from."""
        self.engines = engines
        self._on_finished = on_finished
        self._weights = weights
        self.max_restarts = max_restarts
        self.stall_timeout_s = stall_timeout_s
        self._log = log
        self._pending: deque[Outgoing] = deque()
        self._flight: dict[int, dict[str, Outgoing]] = {engine: {} for engine in engines.clients}
        self._version = {engine: 0 for engine in engines.clients}  # the weight version each engine serves
        self.current = 0  # the version the loop synced last
        self._guard = threading.Lock()  # _pending, _flight, _version, and the busy clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.restarts = 0
        self.behind: set[int] = set()  # engines restarted on weights older than their requests need
        self._busy_since: float | None = None
        self.busy_seconds = 0.0  # wall time with requests in flight on some engine
        self._holding = False  # drain: no request goes out until the next sync

    # --- the loop's side --------------------------------------------------------------------------------------
    def start(self, version: int) -> None:
        self.synced(version)
        self._thread = threading.Thread(target=self._run, name="gdnctl-rollout-stream", daemon=True)
        self._thread.start()

    def submit(self, outgoing: list[Outgoing]) -> None:
        with self._guard:
            self._pending.extend(outgoing)
        self._wake.set()

    def synced(self, version: int) -> None:
        """Every engine serves weight version `version` now (the loop synced them all); requests flow again."""
        with self._guard:
            self.current = version
            for engine in self._version:
                self._version[engine] = version
            self.behind.clear()
            self._holding = False
        self._wake.set()

    def drain(self) -> None:
        """Before a weight update that waits for the requests in flight: hold new ones back until `synced`, and
        return once every engine has finished what it has, its progress still watched (a stall or a death still
        restarts the engine and sends its requests again)."""
        with self._guard:
            self._holding = True
        while True:
            self.check()
            with self._guard:
                if not any(self._flight.values()):
                    return
            time.sleep(POLL_SECONDS / 2)

    def check(self) -> None:
        """Raise, on the loop's thread, what ended the stream's."""
        if self._error is not None:
            raise self._error

    def busy(self) -> float:
        """Seconds with requests in flight so far, the current stretch included."""
        with self._guard:
            now = time.monotonic()
            return self.busy_seconds + (now - self._busy_since if self._busy_since is not None else 0.0)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # --- the stream's thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._poll()
        except BaseException as error:  # noqa: BLE001 - handed to the loop's thread (check)
            self._error = error

    def _poll(self) -> None:
        """Send what is pending, then collect from every engine (waiting up to POLL_SECONDS for a sample): an idle
        engine is asked too, so one that died or hung between steps is found before the loop's next sync needs it."""
        finished: list[tuple[Outgoing, dict]] = []
        with self.engines.lock.after_others():  # a sync waiting for the engines goes first
            self._route()
            self._clock(any(self._flight.values()))
            engines = []
            for engine in list(self._flight):
                try:
                    self.engines.clients[engine].send("collect", wait_s=POLL_SECONDS)  # the engines wait together
                except RolloutError as error:
                    self._failed(engine, str(error))
                    continue
                engines.append(engine)
            for engine in engines:
                reply, failure = self._answer(engine)
                if failure is not None:
                    self._failed(engine, failure)
                    continue
                with self._guard:
                    for result in reply["finished"]:
                        outgoing = self._flight[engine].pop(result["id"], None)
                        if outgoing is not None:
                            finished.append((outgoing, result))
        for outgoing, result in finished:
            self._on_finished(outgoing.key, result)
        if not engines:
            self._wake.wait(POLL_SECONDS)
            self._wake.clear()

    def _answer(self, engine: int) -> tuple[dict | None, str | None]:
        """An engine's answer to `collect`, or why the engine counts as failed."""
        client = self.engines.clients[engine]
        try:
            reply = client.answer("collect", timeout=self.stall_timeout_s, setting="rollout.stall_timeout_s")
        except RolloutError as error:
            return None, str(error)
        if reply["stalled_s"] > self.stall_timeout_s:
            return None, (
                f"{client.who} produced no token for {reply['stalled_s']:.0f} s with {reply['in_flight']} "
                f"request(s) in flight (rollout.stall_timeout_s {self.stall_timeout_s:g})"
            )
        return reply, None

    def _route(self) -> None:
        """Hand the pending requests to the engines that may generate them, the least loaded first."""
        sends: dict[int, list[Outgoing]] = {}
        with self._guard:
            if self._holding:
                return
            kept: deque[Outgoing] = deque()
            while self._pending:
                outgoing = self._pending.popleft()
                able = [e for e in self._flight if e not in self.behind and self._version[e] >= outgoing.min_version]
                if not able:
                    kept.append(outgoing)
                    continue
                engine = min(able, key=lambda e: len(self._flight[e]) + len(sends.get(e, ())))
                sends.setdefault(engine, []).append(outgoing)
            self._pending = kept
        for engine, batch in sends.items():
            client = self.engines.clients[engine]
            try:
                client.send("submit", requests=[o.request for o in batch])
                client.answer("submit", timeout=self.stall_timeout_s, setting="rollout.stall_timeout_s")
            except RolloutError as error:
                with self._guard:
                    self._pending.extendleft(reversed(batch))
                self._failed(engine, str(error))
                continue
            with self._guard:
                self._flight[engine].update((o.request["id"], o) for o in batch)

    def _clock(self, busy: bool) -> None:
        with self._guard:
            now = time.monotonic()
            if busy and self._busy_since is None:
                self._busy_since = now
            elif not busy and self._busy_since is not None:
                self.busy_seconds += now - self._busy_since
                self._busy_since = None

    def _failed(self, engine: int, why: str) -> None:
        """Start engine `engine` again and send its requests again, or fail the job when the restarts are spent."""
        allowed = self.max_restarts if self.engines.can_restart else 0
        if self.restarts >= allowed:
            spent = (
                f"; the job has restarted engines {self.restarts} time(s), rollout.max_engine_restarts {allowed}"
                if allowed
                else ""
            )
            raise RolloutError(why.rstrip(".") + spent)
        self.restarts += 1
        with self._guard:
            lost = list(self._flight[engine].values())
            self._flight[engine] = {}
            self._pending.extendleft(reversed(lost))
        directory, version = self._weights()
        began = time.perf_counter()
        self.engines.restart(engine, directory, version)
        with self._guard:
            self._version[engine] = version
            if version < self.current:  # an in-memory sync left the directory behind: the loop syncs it again
                self.behind.add(engine)
        self._log(
            f"rollout engine {engine} failed ({why.rstrip('.')}); restarted it in {time.perf_counter() - began:.1f} s "
            f"on the weights of step {version} (restart {self.restarts} of rollout.max_engine_restarts {allowed}) "
            f"and sent its {len(lost)} request(s) again"
        )
