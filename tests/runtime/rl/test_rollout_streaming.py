"""The rollout server on vLLM's asynchronous engine (its CPU build), driven over the protocol as the trainer drives
it: requests stream while others are taken, and a partial rollout's weight update stops a request and continues it
re-prefilled under the new weights, so its later tokens are the new weights' and never the old state's."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gdnctl.runtime.rl.rollout import server as rollout_server
from gdnctl.runtime.rl.rollout.protocol import OPERATIONS
from gdnctl.runtime.rl.weights.sync import probe_gap
from tests.runtime.rl.test_rl_vllm import PRESET, needs_vllm, serve_rollout
from tests.runtime.rl.tiny_model import DENSE, model_classes, random_checkpoint

TEMPERATURE = 0.7
PROMPT = list(b"Q: 12 + 30 = ? A:")


def test_the_server_answers_every_operation_of_the_protocol_and_nothing_else():
    assert set(rollout_server.HANDLERS) | {"shutdown"} == set(OPERATIONS)


def _logprobs(directory: Path, tokens: list[int], temperature: float) -> list[float]:
    """transformers' fp32 log-probs of tokens[1:] given their prefix, at `temperature`."""
    import torch

    from gdnctl.runtime.rl.algorithm.grpo import logprobs_from_logits

    model = model_classes(DENSE)[2].from_pretrained(directory, dtype=torch.float32).eval()
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1]
    return logprobs_from_logits(logits, ids[:, 1:], temperature=temperature)[0].tolist()


# One rollout server for both scenarios below, rendered with what each needs: a partial rollout at TEMPERATURE on an
# engine of its own (the continuation), and train.seq_length 2048, so that 1,500-token prompts fit (the token
# budget). Neither setting reaches into the other scenario: rollout.partial only decides what a reload does with the
# requests in flight, and the long prompts' scenario reloads nothing; its requests name their own temperature.
SETTINGS = (
    "rollout.partial=true",
    "rollout.max_staleness=1",
    "rollout.colocate=false",
    "rollout.num_gpus=1",
    "cluster.gpus_per_node=2",
    f"rollout.temperature={TEMPERATURE}",
    "train.seq_length=2048",
)
LONG_PROMPTS = [[65 + (index + position) % 26 for position in range(1500)] for index in range(3)]
PARTIAL_LENGTH = 200  # no stop token: the partial rollout's response runs to its length


@dataclass(frozen=True)
class StreamingRun:
    old: Path  # the weights the server started on
    new: Path  # the weights the partial rollout's reload brought
    long_results: dict[str, dict]  # the three long prompts' results by id, generated under `old`
    continued: int  # the requests the reload stopped and continued
    partial: dict  # the continued request's result


def _collect(client, count: int, timeout: float) -> list[dict]:
    finished: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(finished) < count:
        finished += client.request("collect", wait_s=1.0, timeout=120)["finished"]
        assert time.monotonic() < deadline
    return finished


@pytest.fixture(scope="module")
def streaming_run(tmp_path_factory) -> StreamingRun:
    """One server (tests/conftest.py keeps both tests on one xdist worker): three long seeded prompts on the first
    weights, then a partial rollout's request stopped by a reload to the second weights and continued."""
    base = tmp_path_factory.mktemp("streaming")
    run_dir = base / "run"
    command = [sys.executable, "-m", "gdnctl", "render", PRESET, "-o", str(run_dir)]
    rendered = subprocess.run(
        [*command, *(arg for value in SETTINGS for arg in ("--set", value))],
        text=True,
        capture_output=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    old, new = base / "old", base / "new"
    random_checkpoint(old, seed=1)
    random_checkpoint(new, seed=2)
    client = serve_rollout(run_dir, timeout=600)
    try:
        client.request("start", model=str(old), version=0, timeout=600)
        requests = [
            {"id": f"r{i}", "prompt": p, "max_tokens": 32, "temperature": 1.0, "seed": 11 + i, "stop_token_ids": []}
            for i, p in enumerate(LONG_PROMPTS)
        ]
        assert client.request("submit", requests=requests, timeout=60)["accepted"] == 3
        long_results = {result["id"]: result for result in _collect(client, 3, timeout=300)}

        request = {
            "id": "p0",
            "prompt": PROMPT,
            "max_tokens": PARTIAL_LENGTH,
            "temperature": TEMPERATURE,
            "seed": 7,
            "stop_token_ids": [],
        }
        assert client.request("submit", requests=[request], timeout=60)["accepted"] == 1
        # The weight update comes once the request is under way and well before its end.
        deadline = time.monotonic() + 300
        while True:
            progress = client.request("collect", wait_s=0.05, timeout=60)
            assert not progress["finished"], "the request finished before the update; lengthen it"
            if progress["progress"].get("p0", 0) >= 8:
                break
            assert time.monotonic() < deadline
        reloaded = client.request("load_weights", path=str(new), probe=PROMPT, version=1, timeout=600)
        (partial,) = _collect(client, 1, timeout=300)
    finally:
        client.close()
    return StreamingRun(old, new, long_results, reloaded["continued"], partial)


@needs_vllm
def test_a_partial_rollout_continues_a_request_under_the_new_weights_prefilled_anew(streaming_run):
    assert streaming_run.continued == 1
    result = streaming_run.partial
    tokens, versions = result["tokens"], result["versions"]
    assert len(tokens) == PARTIAL_LENGTH and result["continued"] == 1 and result["finish_reason"] == "length"
    cut = versions.index(1)
    assert 0 < cut < PARTIAL_LENGTH and versions == [0] * cut + [1] * (PARTIAL_LENGTH - cut), versions
    # Each token's engine log-prob is the one of the weights that generated it, at the sampling temperature:
    # before the cut the old weights', after it the new weights' over the whole prefix prefilled anew.
    sequence = PROMPT + tokens
    under_old = _logprobs(streaming_run.old, sequence, TEMPERATURE)[len(PROMPT) - 1 :]
    under_new = _logprobs(streaming_run.new, sequence, TEMPERATURE)[len(PROMPT) - 1 :]
    engine = result["logprobs"]
    assert probe_gap(under_old[:cut], engine[:cut]) < 0.02
    assert probe_gap(under_new[cut:], engine[cut:]) < 0.02
    assert probe_gap(under_old[cut:], engine[cut:]) > 0.1  # the two weights tell apart


@needs_vllm
def test_long_seeded_prompts_past_a_steps_token_budget_are_served_and_score_as_transformers_does(streaming_run):
    """Three seeded prompts of 1,500 tokens: more than one engine step's 2,048-token budget. With chunked prefill
    vLLM's CPU build split one over two steps and its engine died rewinding the request's CPU generator; the server
    prefills each whole (rollout/server.py engine_kwargs), and their log-probs stay transformers' own."""
    by_id = streaming_run.long_results
    assert all(len(by_id[f"r{i}"]["tokens"]) == 32 for i in range(3))
    first = by_id["r0"]
    reference = _logprobs(streaming_run.old, LONG_PROMPTS[0] + first["tokens"], 1.0)[len(LONG_PROMPTS[0]) - 1 :]
    assert probe_gap(reference, first["logprobs"]) < 0.02
