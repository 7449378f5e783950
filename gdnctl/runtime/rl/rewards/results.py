"""What every scorer takes and gives: one sample to score (`RewardRequest`), its score with the times that show when
it was worked on (`RewardResult`), and the bookkeeping of `submit` then `collect` (`Collector`).

A scorer takes one finished sample at a time, so the loop hands it each sample as soon as the sample exists (an
engine's answer, or a stream's finished request) and collects the scores once it needs them; `collect` returns
every score submitted since the last `collect`, in submission order.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RewardRequest:
    prompt: str  # the prompt's text as the model was given it (a chat through the chat template)
    response: str  # the decoded response, special tokens left out
    response_ids: tuple[int, ...]
    record: dict[str, Any]  # the dataset line's whole JSON object
    where: str  # the sample, for messages: "train.data_path line 12, sample 3 of 8"

    def payload(self) -> dict[str, Any]:
        """The keyword arguments of a reward function, and one sample of a reward server's request."""
        return {
            "prompt": self.prompt,
            "response": self.response,
            "response_ids": list(self.response_ids),
            "record": self.record,
        }


@dataclass(frozen=True)
class RewardResult:
    score: float
    metrics: dict[str, float] = field(default_factory=dict)  # the extra numbers the scorer returned
    failure: str | None = None  # why the call failed (then `score` is the default the preset gives)
    # Wall-clock times (time.time()): submitted to the scorer, and when its work on the sample began and ended.
    submitted: float = 0.0
    started: float = 0.0
    finished: float = 0.0


class Collector:
    """Tickets in submission order, the results as workers deliver them, and `collect` waiting for all of them."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._results: dict[int, RewardResult] = {}
        self._issued = 0
        self._error: BaseException | None = None

    def _ticket(self) -> int:
        with self._ready:
            ticket = self._issued
            self._issued += 1
            return ticket

    def _deliver(self, ticket: int, result: RewardResult) -> None:
        with self._ready:
            self._results[ticket] = result
            self._ready.notify_all()

    def _fail(self, error: BaseException) -> None:
        """A scorer that cannot go on (a reward server that stopped answering): `collect` raises `error`."""
        with self._ready:
            if self._error is None:
                self._error = error
            self._ready.notify_all()

    def collect(self) -> list[RewardResult]:
        """Every result submitted since the last collect, in submission order, once all are in."""
        with self._ready:
            self._ready.wait_for(lambda: self._error is not None or len(self._results) == self._issued)
            if self._error is not None:
                raise self._error
            results = [self._results[ticket] for ticket in range(self._issued)]
            self._results.clear()
            self._issued = 0
            return results
