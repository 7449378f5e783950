"""grpo.reward: {function: ...} in its pool of real worker processes: scores in submission order, a hung call killed
at its timeout and its worker replaced, a raising call, a NaN, the CPU and memory limits, an import that fails
at start; and one batch's samples through StepRewards with grpo.reward.on_error stop and default."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gdnctl.runtime.rl.prompts import PromptRecord
from gdnctl.runtime.rl.rewards import FunctionPool, RewardFunctionError, RewardRequest, StepRewards
from gdnctl.runtime.rl.user_code import UserCodeError
from gdnctl.schema import EngineRewardFunction, EngineUserCode

REWARDS = """
import math, time

def score(prompt, response, response_ids, record):
    if response == "hang":
        time.sleep(600)
    if response == "raise":
        raise ValueError("no score for " + record["name"])
    if response == "nan":
        return math.nan
    if response == "spin":
        while True:
            pass
    if response == "hog":
        hog = bytearray(2 * 2**30)
    if response.startswith("sleep"):
        time.sleep(float(response.split()[1]))
    return {"score": len(response) / 10, "tokens": len(response_ids), "first": record["first"]}
"""


def spec(path: Path, name: str = "score", **limits) -> EngineRewardFunction:
    settings = {"workers": 2, "timeout_s": 3.0, "cpu_seconds": None, "memory_gib": None, "on_error": "default"}
    settings.update(limits)
    return EngineRewardFunction(
        code=EngineUserCode(field="grpo.reward.function", file=str(path), module=None, name=name),
        default_score=-1.0,
        **settings,
    )


@pytest.fixture
def rewards_file(tmp_path) -> Path:
    path = tmp_path / "rewards.py"
    path.write_text(REWARDS)
    return path


def request(response: str) -> RewardRequest:
    return RewardRequest("Q:", response, (1, 2, 3), {"name": "line 7", "first": 1.5}, f"sample {response}")


def test_scores_come_back_in_submission_order_with_the_functions_extra_numbers(rewards_file):
    pool = FunctionPool(spec(rewards_file))
    try:
        for response in ("a", "bbb", "cc"):
            pool.submit(request(response))
        results = pool.collect()
        assert [r.score for r in results] == [0.1, 0.3, 0.2]
        assert results[0].metrics == {"tokens": 3.0, "first": 1.5} and results[0].failure is None
        assert all(r.submitted <= r.started <= r.finished for r in results)
        pool.submit(request("dddd"))  # collect starts a new batch
        assert [r.score for r in pool.collect()] == [0.4]
    finally:
        pool.close()


def test_a_hung_call_is_killed_at_its_timeout_and_its_worker_replaced_while_the_others_go_on(rewards_file):
    pool = FunctionPool(spec(rewards_file, workers=1, timeout_s=1.0))
    try:
        (before,) = pool.pids
        for response in ("hang", "ok"):
            pool.submit(request(response))
        hung, after_it = pool.collect()
        assert hung.score == -1.0 and "did not return within 1 s (grpo.reward.timeout_s)" in hung.failure
        assert 1.0 <= hung.finished - hung.started < 2.0
        assert after_it.score == 0.2 and after_it.failure is None  # the replacement scored the next sample
        assert pool.pids != [before] and pool.replaced == 1
    finally:
        pool.close()


def test_a_raise_and_a_nan_fail_their_samples_and_the_worker_goes_on(rewards_file):
    pool = FunctionPool(spec(rewards_file, workers=1))
    try:
        for response in ("raise", "nan", "ok"):
            pool.submit(request(response))
        raised, nan, fine = pool.collect()
        assert raised.failure == "it raised ValueError: no score for line 7 (rewards.py:8)"
        assert nan.failure == "it is nan, not a finite number"
        assert fine.score == 0.2 and pool.replaced == 0
    finally:
        pool.close()


def test_the_cpu_and_memory_limits_fail_the_call_and_keep_the_worker(rewards_file):
    # The timeout is far off: on a loaded machine the spinning call gets a fraction of a core, and its CPU limit
    # (SIGXCPU, not the timeout, as the failure says) takes that much longer to reach.
    pool = FunctionPool(spec(rewards_file, workers=1, timeout_s=300.0, cpu_seconds=1.0, memory_gib=1.0))
    try:
        for response in ("spin", "hog", "ok"):
            pool.submit(request(response))
        spun, hogged, fine = pool.collect()
        assert spun.failure == "it used more than 1 CPU seconds (grpo.reward.cpu_seconds)"
        assert hogged.failure == "it ran out of memory (grpo.reward.memory_gib)"
        assert fine.failure is None and pool.replaced == 0
    finally:
        pool.close()


def test_samples_are_scored_as_they_are_submitted_not_when_collected(rewards_file):
    """The first sample is done before the second is even submitted: the pool works while the loop still waits
    for the rest of the batch (another engine's answer)."""
    pool = FunctionPool(spec(rewards_file, workers=1))
    try:
        pool.submit(request("sleep 0.2"))
        time.sleep(2.0)
        pool.submit(request("ok"))
        first, second = pool.collect()
        assert first.finished < second.submitted
    finally:
        pool.close()


@pytest.mark.parametrize(
    "source, name, said",
    [
        ("import no_such_module\n", "score", "importing {path} failed: ModuleNotFoundError: No module named"),
        ("def scroe(**kw):\n    return 1\n", "score", "the module defines no score"),
        ("score = 3\n", "score", "score is a int, not a function"),
        ("def score(:\n", "score", "{path}:1: invalid syntax"),
    ],
)
def test_code_that_cannot_be_called_stops_the_pool_at_start_with_a_sentence(tmp_path, source, name, said):
    path = tmp_path / "broken.py"
    path.write_text(source)
    with pytest.raises(UserCodeError) as caught:
        FunctionPool(spec(path, name))
    assert str(caught.value).startswith(f"grpo.reward.function {path}:{name}: ")
    assert said.format(path=path) in str(caught.value)


def batch(records, responses_per_prompt):
    groups = [[{"tokens": list(text.encode())} for text in responses] for responses in responses_per_prompt]
    return records, groups


def step_rewards(pool, function_spec, records, logs_dir, lines):
    return StepRewards(
        pool,
        function_spec,
        decode=lambda ids: bytes(ids).decode(),
        records=records,
        prompt_texts=["Q:"] * len(records),
        dataset="train.data_path",
        log=lines.append,
        logs_dir=logs_dir,
        step=3,
        timeline=True,
    )


def test_on_error_default_scores_failed_samples_with_the_default_counts_and_logs_them(rewards_file, tmp_path):
    records = [PromptRecord("Q:", "1", 4, {"name": "four", "first": 1.0}), PromptRecord("Q:", "2", 9, {"first": 2.0})]
    function_spec = spec(rewards_file, timeout_s=2.0)
    pool = FunctionPool(function_spec)
    lines: list[str] = []
    try:
        scoring = step_rewards(pool, function_spec, records, tmp_path / "logs", lines)
        records, groups = batch(records, [["hang", "ok"], ["nan", "abc"]])
        scoring.answered(1, groups[1:])  # the second engine's prompt arrives first
        scores, stats = scoring.finish(groups)
    finally:
        pool.close()
    assert scores == [-1.0, 0.2, -1.0, 0.3]
    assert stats["reward_failures"] == 2 and stats["reward_metrics"]["tokens"] == 2.5
    failures = [json.loads(line) for line in (tmp_path / "logs" / "reward_failures.jsonl").read_text().splitlines()]
    assert [(f["sample"], f["response"], f["score"]) for f in failures] == [
        ("train.data_path line 9, sample 1", "nan", -1.0),
        ("train.data_path line 4, sample 1", "hang", -1.0),
    ]
    assert lines[0].startswith(f"step 3: grpo.reward.function {rewards_file}:score failed on train.data_path line 9")
    (timeline,) = [json.loads(line) for line in (tmp_path / "logs" / "reward_timeline.jsonl").read_text().splitlines()]
    assert timeline["step"] == 3 and timeline["answers"][0]["prompts"] == [1, 2]
    assert [(s["prompt"], s["sample"], s["failed"]) for s in timeline["samples"]] == [
        (1, 0, True),
        (1, 1, False),
        (0, 0, True),
        (0, 1, False),
    ]


def test_on_error_stop_ends_the_batch_with_a_sentence_naming_the_sample_and_the_function(rewards_file, tmp_path):
    records = [PromptRecord("Q:", "1", 12, {"name": "twelve", "first": 1.0})]
    function_spec = spec(rewards_file, on_error="stop")
    pool = FunctionPool(function_spec)
    try:
        scoring = step_rewards(pool, function_spec, records, tmp_path, [])
        records, groups = batch(records, [["ok", "raise"]])
        with pytest.raises(RewardFunctionError) as caught:
            scoring.finish(groups)
    finally:
        pool.close()
    assert str(caught.value) == (
        f"grpo.reward.function {rewards_file}:score failed on train.data_path line 12, sample 2: it raised "
        "ValueError: no score for twelve (rewards.py:8); fix the function, or set grpo.reward.on_error: default to "
        "give such samples grpo.reward.default_score."
    )


def test_one_engines_samples_are_scored_while_another_engine_still_generates(rewards_file, tmp_path):
    """Two engines answering two seconds apart (the second answer is held back here): the first engine's samples
    are scored meanwhile, as reward_overlap_seconds and the timeline show."""
    records = [PromptRecord("Q:", "1", line, {"first": 0.0}) for line in (1, 2)]
    function_spec = spec(rewards_file)
    pool = FunctionPool(function_spec)
    try:
        scoring = step_rewards(pool, function_spec, records, tmp_path, [])
        records, groups = batch(records, [["sleep 0.3", "sleep 0.3"], ["x", "y"]])
        scoring.answered(0, groups[:1])
        time.sleep(2.0)
        scoring.answered(1, groups[1:])
        scores, stats = scoring.finish(groups)
    finally:
        pool.close()
    assert stats["reward_overlap_seconds"] >= 0.5  # two 0.3 s calls, done before the second answer
    (row,) = [json.loads(line) for line in (tmp_path / "reward_timeline.jsonl").read_text().splitlines()]
    second_answer = row["answers"][1]["at"]
    assert all(s["finished"] < second_answer for s in row["samples"] if s["prompt"] == 0), row
