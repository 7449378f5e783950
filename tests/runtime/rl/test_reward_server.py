"""grpo.reward: {url: ...} against a real HTTP server on loopback (the standard library's, in a thread): the batch
protocol, batches and requests in flight, retries with backoff past 503s, and the sentences for a server that is
down, refuses the request or answers outside the protocol."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gdnctl.runtime.rl.rewards import RewardRequest, RewardServerError, ServerScorer
from gdnctl.runtime.rl.rewards.http_client import backoff_seconds
from gdnctl.schema import EngineRewardServer


class RewardServer:
    """A reward server that scores len(response) / 10, and can be told to fail first, answer slowly or answer
    something else. It records every batch it was sent and the most requests it had in flight at once."""

    def __init__(self) -> None:
        self.failures: list[int] = []  # statuses to answer before scoring
        self.delay = 0.0
        self.answer = None  # (samples) -> payload, instead of the scores
        self.batches: list[list[dict]] = []
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        test = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                samples = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["samples"]
                with test.lock:
                    test.batches.append(samples)
                    test.in_flight += 1
                    test.most_in_flight = max(test.most_in_flight, test.in_flight)
                    status = test.failures.pop(0) if test.failures and samples else 200
                time.sleep(test.delay if samples else 0)
                if status == 200 and test.answer is not None and samples:
                    payload = test.answer(samples)
                else:
                    payload = {
                        "scores": [{"score": len(s["response"]) / 10, "line": s["record"]["line"]} for s in samples]
                    }
                data = json.dumps(payload).encode() if status == 200 else b"busy, try later"
                # Out of flight before the answer goes: once the client has read it, it may send the next request
                # at once, which must not find this one still counted.
                with test.lock:
                    test.in_flight -= 1
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/score"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def server():
    running = RewardServer()
    yield running
    running.close()


def spec(url: str, **settings) -> EngineRewardServer:
    values = {"timeout_s": 5.0, "retries": 3, "concurrency": 2, "batch_size": 4}
    values.update(settings)
    return EngineRewardServer(url=url, **values)


def request(response: str, line: int = 1) -> RewardRequest:
    return RewardRequest("Q:", response, (5, 6), {"line": line, "tests": ["assert f() == 1"]}, f"line {line}")


def test_batches_of_samples_are_scored_by_the_server_with_its_extra_numbers(server):
    server.delay = 0.3
    scorer = ServerScorer(spec(server.url))
    try:
        assert server.batches == [[]]  # the start-up check: an empty batch, answered with no scores
        for index in range(10):
            scorer.submit(request("x" * index, line=index))
        results = scorer.collect()
    finally:
        scorer.close()
    assert [r.score for r in results] == [index / 10 for index in range(10)]
    assert [r.metrics["line"] for r in results] == list(range(10))
    sent = server.batches[1:]
    assert sum(len(b) for b in sent) == 10 and all(1 <= len(b) <= 4 for b in sent)
    first = next(sample for b in sent for sample in b if sample["record"]["line"] == 0)
    assert first == {"prompt": "Q:", "response": "", "response_ids": [5, 6], "record": request("", line=0).record}
    assert server.most_in_flight == 2  # grpo.reward.concurrency


def test_503s_are_retried_with_backoff_until_the_server_scores(server):
    scorer = ServerScorer(spec(server.url, concurrency=1))
    server.failures = [503, 503]
    try:
        began = time.monotonic()
        scorer.submit(request("abc"))
        (result,) = scorer.collect()
        waited = time.monotonic() - began
    finally:
        scorer.close()
    assert result.score == 0.3
    assert len(server.batches) == 4  # the check, two 503s, the answer
    assert 0.25 + 0.5 <= waited < 5  # backoffs of 0.5 and 1 s, each less up to half


def test_a_server_that_is_down_ends_in_a_sentence_after_its_retries():
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/score"
    with pytest.raises(RewardServerError) as caught:
        ServerScorer(spec(url, retries=1))
    message = str(caught.value)
    assert message.startswith(f"grpo.reward.url {url} failed 2 times in ")
    assert "ConnectionRefusedError" in message and message.endswith(
        "start the server or fix the url, or raise grpo.reward.retries or grpo.reward.timeout_s if it is only slow."
    )


def _refusal(server: RewardServer) -> pytest.ExceptionInfo[RewardServerError]:
    """What stops the job when `server`, set up to fail, is asked to score one sample."""
    scorer = ServerScorer(spec(server.url))
    try:
        scorer.submit(request("abc"))
        with pytest.raises(RewardServerError) as caught:
            scorer.collect()
    finally:
        scorer.close()
    return caught


def test_a_refused_request_is_not_retried_and_stops_the_job_with_the_servers_words(server):
    server.failures = [400]
    caught = _refusal(server)
    assert str(caught.value).startswith(f"grpo.reward.url {server.url} answered HTTP 400: 'busy, try later'; ")
    assert len(server.batches) == 2


@pytest.mark.parametrize(
    "answer, said",
    [
        (lambda samples: {"score": 1}, 'it must answer {"scores": [...]} with one entry per sample'),
        (lambda samples: {"scores": []}, "to a batch of 1 sample(s)"),
        (lambda samples: {"scores": [float("nan")]}, "scored line 1 with NaN: it is nan, not a finite number"),
        (lambda samples: {"scores": [{"points": 1}]}, "it returned a mapping without a 'score' (keys: points)"),
    ],
)
def test_an_answer_outside_the_protocol_stops_the_job_with_a_sentence(server, answer, said):
    server.answer = answer
    caught = _refusal(server)
    assert said in str(caught.value)


def test_an_answer_past_the_size_limit_stops_the_job_without_being_read_whole(server):
    """A server that sends its scores with 17 MiB beside them: the job reads 16 MiB and a byte, stops, and never
    asks again (a size is no transient failure)."""
    server.answer = lambda samples: {"scores": [1.0] * len(samples), "log": "x" * (17 * 2**20)}
    caught = _refusal(server)
    assert str(caught.value).startswith(f"grpo.reward.url {server.url} answered more than 16 MiB to a batch of 1 ")
    assert len(server.batches) == 2  # the start-up check and the one batch


def test_backoff_doubles_from_half_a_second_to_its_cap_and_honours_retry_after():
    for attempt, full in ((0, 0.5), (1, 1.0), (3, 4.0), (10, 30.0)):
        waits = [backoff_seconds(attempt) for _ in range(50)]
        assert all(full / 2 <= wait <= full for wait in waits)
    assert backoff_seconds(0, "7") == 7.0 and backoff_seconds(0, "900") == 60.0
