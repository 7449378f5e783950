"""rl on your own task, end to end on CPU with vLLM's CPU build: a reward function of the user's in worker processes,
a reward server on loopback, and the calculator environment's two-turn episodes (the shipped examples in
examples/toy-rewards and examples/toy-tools), each a couple of steps; and reward calls that hang, raise or return
NaN handled as grpo.reward.on_error says, in a real job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.rl.test_rl_vllm import SMALL_STEPS, VLLM_PYTHON, eval_rows, metrics, needs_vllm, vllm_env

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
REWARDS_PRESET = EXAMPLES / "toy-rewards" / "rewards-rl-cpu.yaml"
TOOLS_PRESET = EXAMPLES / "toy-tools" / "tools-rl-cpu.yaml"
TWO_STEPS = (*SMALL_STEPS, "train.train_iters=2", "eval=null")


def launch(preset: Path | str, run_dir: Path, *sets: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "gdnctl", "launch", str(preset), "-o", str(run_dir), "--force"]
    for value in (f"rollout.python={VLLM_PYTHON}", *sets):
        command += ["--set", value]
    return subprocess.run(command, text=True, capture_output=True, timeout=900, env=vllm_env(), check=False)


def log_rows(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "logs" / name).read_text().splitlines()]


@needs_vllm
def test_a_reward_function_scores_each_engines_samples_in_worker_processes_as_they_arrive(tmp_path):
    """digits.py in four workers beside trainer rank 0, two colocated engines (two CPU ranks): its extra numbers
    reach metrics.jsonl as reward/NAME, and the timeline has every sample submitted once it finished (the streaming
    rollout scores each sample as its engine reports it)."""
    run_dir = tmp_path / "run"
    done = launch(REWARDS_PRESET, run_dir, *TWO_STEPS, "cluster.gpus_per_node=2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        assert step["reward_failures"] == 0 and 0 <= step["reward_mean"] <= 1
        assert step["reward/digits"] >= 0 and 0 <= step["reward/has_answer"] <= 1
        assert step["reward_overlap_seconds"] >= 0 and step["reward_wait_seconds"] >= 0
        assert step["rollout_engines"] == 2
    for row in log_rows(run_dir, "reward_timeline.jsonl"):
        assert len(row["samples"]) == len(row["answers"]) == 16  # one answer per sample, as each finished
        for answer, sample in zip(row["answers"], row["samples"], strict=True):
            assert answer["prompts"] == [sample["prompt"], sample["prompt"] + 1]
            assert answer["at"] <= sample["submitted"] <= sample["started"] <= sample["finished"]


@needs_vllm
def test_a_reward_server_on_loopback_scores_the_jobs_samples(tmp_path):
    """examples/toy-rewards/server.py in its own process: the job checks it before step 1, then POSTs each batch."""
    server = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "toy-rewards" / "server.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = server.stdout.readline().split()[-1]
        run_dir = tmp_path / "run"
        done = launch(REWARDS_PRESET, run_dir, *TWO_STEPS, f"grpo.reward={{url: '{url}', batch_size: 8}}")
    finally:
        server.terminate()
        requests = server.communicate(timeout=30)[1].splitlines()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == [1, 2] and all("reward/digits" in s for s in steps)
    assert len([line for line in requests if '"POST /score' in line and " 200 " in line]) >= 1 + 2 * 2


@needs_vllm
def test_the_calculator_environment_runs_two_turn_episodes_whose_tool_tokens_take_no_loss(tmp_path):
    """The tool example, a couple of steps: episodes take one or two model turns (two when the model called the
    calculator), the trainer scores the model's tokens as vLLM did (the tool's tokens, masked, would not match),
    and the held-out evaluation runs episodes too."""
    run_dir = tmp_path / "run"
    done = launch(TOOLS_PRESET, run_dir, *SMALL_STEPS, "train.train_iters=2", "eval.interval=2", "eval.max_prompts=4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        assert 1 <= step["episode_turns"] <= 2 and step["episodes_cut"] == 0
        assert 0 <= step["reward/called"] <= 1 and 0 <= step["reward/correct"] <= 1
        assert step["rollout_logprob_abs_diff"] < 0.01, step  # measured 0.0013-0.0015
        assert step["reward_mean"] == pytest.approx(0.5 * step["reward/called"] + 0.5 * step["reward/correct"])
    (evaluation,) = eval_rows(run_dir)
    assert evaluation["step"] == 2 and evaluation["eval_prompts"] == 4


TRAPS = """
import math, time

def score(prompt, response, response_ids, record):
    trap = record.get("trap")
    if trap == "hang":
        time.sleep(600)
    if trap == "raise":
        raise ValueError("the tests of " + record["name"] + " did not run")
    if trap == "nan":
        return math.nan
    return 0.5
"""


def trapped(tmp_path: Path, traps: list[str | None]) -> tuple[Path, Path]:
    """A reward function that hangs, raises or returns NaN on the records that ask it to, and four such records."""
    (tmp_path / "traps.py").write_text(TRAPS)
    lines = [
        json.dumps(
            {"prompt": f"Q: {index} + 1 = ? A:", "answer": str(index + 1), "name": f"task {index}", "trap": trap}
        )
        for index, trap in enumerate(traps)
    ]
    (tmp_path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "traps.py", tmp_path / "prompts.jsonl"


@needs_vllm
def test_calls_that_hang_raise_or_return_nan_take_the_default_score_and_are_counted_and_logged(tmp_path):
    code, prompts = trapped(tmp_path, ["hang", "raise", "nan", None])
    run_dir = tmp_path / "run"
    done = launch(
        "tiny-qwen3.5-rl-cpu",
        run_dir,
        *SMALL_STEPS,
        "train.train_iters=1",
        "eval=null",
        f"train.data_path={prompts}",
        f"grpo.reward={{function: '{code}:score', timeout_s: 2, on_error: default, default_score: -1}}",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (step,) = metrics(run_dir)
    assert step["reward_failures"] == 12  # three trapped prompts x four samples
    assert step["reward_mean"] == pytest.approx((12 * -1 + 4 * 0.5) / 16)
    failures = log_rows(run_dir, "reward_failures.jsonl")
    reasons = {row["sample"].split(",")[0]: row["failure"] for row in failures}
    assert reasons == {
        "train.data_path line 1": "it did not return within 2 s (grpo.reward.timeout_s); its worker was killed and "
        "replaced",
        "train.data_path line 2": "it raised ValueError: the tests of task 1 did not run (traps.py:9)",
        "train.data_path line 3": "it is nan, not a finite number",
    }
    assert all(row["step"] == 1 and row["score"] == -1 and "response" in row for row in failures)
    assert "(grpo.reward.on_error: default)" in done.stdout and "more sample(s) failed the same way" in done.stdout


@needs_vllm
def test_a_call_that_raises_with_on_error_stop_ends_the_job_with_a_sentence_naming_the_sample(tmp_path):
    code, prompts = trapped(tmp_path, [None, "raise", None, None])
    done = launch(
        "tiny-qwen3.5-rl-cpu",
        tmp_path / "run",
        *SMALL_STEPS,
        "train.train_iters=1",
        "eval=null",
        f"train.data_path={prompts}",
        f"grpo.reward={{function: '{code}:score'}}",
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert (
        f"grpo.reward.function {code}:score failed on train.data_path line 2, sample 1: it raised ValueError: the "
        "tests of task 1 did not run (traps.py:9); fix the function, or set grpo.reward.on_error: default"
    ) in done.stderr
    assert "Traceback" not in done.stderr
