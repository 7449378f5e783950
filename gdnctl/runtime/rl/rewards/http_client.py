"""grpo.reward: {url: ...}: samples scored by a reward server of the user's, over HTTP.

The request, one POST to the url per batch of at most grpo.reward.batch_size samples
(Content-Type: application/json):

    {"samples": [{"prompt": "...", "response": "...", "response_ids": [17, 42], "record": {...}}, ...]}

prompt is the prompt's text as the model was given it, response the decoded response, response_ids its tokens
and record the dataset line's whole JSON object. The answer, status 200 with a JSON body:

    {"scores": [1.0, {"score": 0.5, "passed_tests": 3}, ...]}

one entry per sample, in order: a number, or an object with a number under "score" and other numbers beside it,
which the job reports as metrics (`reward/NAME`). Before step 1 the job sends {"samples": []} and expects
{"scores": []}, so a server that is down or speaks another protocol stops the job before any GPU is used.

grpo.reward.concurrency requests are in flight at once, each taking whatever samples are waiting (so a batch
fills while the previous ones are scored). A request that cannot connect, times out (grpo.reward.timeout_s, the
socket's timeout: for the connection, and for the answer or each next part of it) or is answered 429 or 5xx is
sent again up to grpo.reward.retries times, after an exponential backoff (half a second, doubling, at most 30 s,
less a random part of up to half, so that retries from several requests spread out; a Retry-After header in
seconds is honoured, up to a minute); any other status, an answer that is not the protocol's, or the retries
running out, stops the job with a sentence, as does an answer longer than MAX_ANSWER_BYTES (a score and a few
numbers a sample take a few dozen bytes: an answer past that is a server gone wrong, not one to hold in memory).
The client is the standard library's http.client: one keep-alive connection per request slot, and no package the
trainer's image may lack.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections import deque
from urllib.parse import urlsplit

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.rewards.results import Collector, RewardRequest, RewardResult
from gdnctl.runtime.rl.user_code import ScoreError, read_score
from gdnctl.schema import EngineRewardServer

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
RETRY_AFTER_MAX_S = 60.0
# How much of an answer's body a message shows.
BODY_EXCERPT = 200
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_ANSWER_BYTES = 16 * 2**20


class RewardServerError(GdnctlError):
    """The reward server cannot be reached, or its answers are not the protocol's."""

    exit_code = 1


def backoff_seconds(attempt: int, retry_after: str | None = None) -> float:
    """How long to wait before attempt `attempt + 1` (attempt 0 was the first try)."""
    if retry_after is not None and retry_after.strip().isdigit():
        return min(float(retry_after.strip()), RETRY_AFTER_MAX_S)
    return min(BACKOFF_FIRST_S * 2**attempt, BACKOFF_MAX_S) * random.uniform(0.5, 1.0)


class _AnswerTooLong(Exception):
    """The answer's body ran past MAX_ANSWER_BYTES (read no further)."""


class _Connection:
    """One request slot's keep-alive connection, opened again after any failure."""

    def __init__(self, spec: EngineRewardServer) -> None:
        parts = urlsplit(spec.url)
        self._kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._host, self._port = parts.hostname, parts.port
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._timeout = spec.timeout_s
        self._connection: http.client.HTTPConnection | None = None

    def post(self, body: bytes) -> tuple[int, str | None, bytes]:
        if self._connection is None:
            self._connection = self._kind(self._host, self._port, timeout=self._timeout)
        try:
            self._connection.request(
                "POST", self.path, body, {"Content-Type": "application/json", "Accept": "application/json"}
            )
            answer = self._connection.getresponse()
            data = answer.read(MAX_ANSWER_BYTES + 1)
            if len(data) > MAX_ANSWER_BYTES:
                raise _AnswerTooLong
        except BaseException:
            self.close()
            raise
        if answer.will_close:
            self.close()
        return answer.status, answer.getheader("Retry-After"), data

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class ServerScorer(Collector):
    """Samples scored by the reward server at grpo.reward.url: `submit` one sample, `collect` the scores."""

    kind = "server"

    def __init__(self, spec: EngineRewardServer) -> None:
        super().__init__()
        self.spec = spec
        self._waiting: deque = deque()  # (ticket, request, submitted)
        self._arrived = threading.Condition()
        self._closed = False
        check = _Connection(spec)
        try:
            self._scores(check, [])
        finally:
            check.close()
        self._threads = [
            threading.Thread(target=self._drive, name="gdnctl-reward-server", daemon=True)
            for _ in range(spec.concurrency)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, request: RewardRequest) -> None:
        with self._arrived:
            self._waiting.append((self._ticket(), request, time.time()))
            self._arrived.notify()

    def _drive(self) -> None:
        connection = _Connection(self.spec)
        try:
            while True:
                with self._arrived:
                    self._arrived.wait_for(lambda: self._waiting or self._closed)
                    if self._closed:
                        return
                    batch = [self._waiting.popleft() for _ in range(min(len(self._waiting), self.spec.batch_size))]
                started = time.time()
                try:
                    scores = self._scores(connection, [request for _, request, _ in batch])
                except RewardServerError as error:
                    self._fail(error)
                    return
                finished = time.time()
                for (ticket, _, submitted), (score, metrics) in zip(batch, scores, strict=True):
                    self._deliver(ticket, RewardResult(score, metrics, None, submitted, started, finished))
        finally:
            connection.close()

    def _scores(self, connection: _Connection, batch: list[RewardRequest]) -> list[tuple[float, dict[str, float]]]:
        """One batch through the server, with the retries; the (score, metrics) of each sample."""
        body = json.dumps({"samples": [request.payload() for request in batch]}).encode()
        url, attempts = self.spec.url, 1 + self.spec.retries
        began = time.monotonic()
        for attempt in range(attempts):
            retry_after = None
            try:
                status, retry_after, data = connection.post(body)
            except _AnswerTooLong:
                raise RewardServerError(
                    f"grpo.reward.url {url} answered more than {MAX_ANSWER_BYTES // 2**20} MiB to a batch of "
                    f"{len(batch)} sample(s); an answer is one score (and a few numbers) per sample, so fix what the "
                    "server sends back."
                ) from None
            except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, a broken answer
                last = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            else:
                if status == 200:
                    return self._read(data, batch)
                last = f"HTTP {status}: {_excerpt(data)}"
                if status not in RETRIED_STATUSES:
                    raise RewardServerError(
                        f"grpo.reward.url {url} answered {last}; a reward server answers 200 with "
                        '{"scores": [...]} (docs/rl.md, "A reward server"), so fix the server or the url.'
                    )
            if attempt + 1 < attempts:
                time.sleep(backoff_seconds(attempt, retry_after))
        raise RewardServerError(
            f"grpo.reward.url {url} failed {attempts} time{'s' if attempts > 1 else ''} in "
            f"{time.monotonic() - began:.1f} s (the last: {last}); start the server or fix the url, or raise "
            "grpo.reward.retries or grpo.reward.timeout_s if it is only slow."
        )

    def _read(self, data: bytes, batch: list[RewardRequest]) -> list[tuple[float, dict[str, float]]]:
        url = self.spec.url
        try:
            answer = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise RewardServerError(
                f"grpo.reward.url {url} answered 200 with a body that is not JSON ({_excerpt(data)}); it must "
                'answer {"scores": [...]}.'
            ) from None
        scores = answer.get("scores") if isinstance(answer, dict) else None
        if not isinstance(scores, list) or len(scores) != len(batch):
            raise RewardServerError(
                f"grpo.reward.url {url} answered {_excerpt(data)} to a batch of {len(batch)} sample(s); it must "
                f'answer {{"scores": [...]}} with one entry per sample, in order.'
            )
        read = []
        for request, value in zip(batch, scores, strict=True):
            try:
                read.append(read_score(value))
            except ScoreError as error:
                raise RewardServerError(
                    f"grpo.reward.url {url} scored {request.where} with {json.dumps(value)[:BODY_EXCERPT]}: "
                    f'{error}; a score is a finite number, or an object with one under "score".'
                ) from None
        return read

    def close(self) -> None:
        with self._arrived:
            self._closed = True
            self._arrived.notify_all()
        for thread in self._threads:
            thread.join(self.spec.timeout_s)


def _excerpt(data: bytes) -> str:
    text = data.decode(errors="replace").strip().replace("\n", " ")
    return repr(text if len(text) <= BODY_EXCERPT else text[: BODY_EXCERPT - 3] + "...")
