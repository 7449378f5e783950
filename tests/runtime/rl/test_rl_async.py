"""The rl loop's streaming rollout end to end on CPU (vLLM's CPU build, the torch policy): log-probs at the sampling
temperature, the off-policy loop with its staleness bound and a resume across the batch in flight, engines that die
or hang and are restarted, dynamic sampling and over-long shaping."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from gdnctl.runtime.rl.job import prompts_digest
from gdnctl.runtime.rl.prompts import PromptSchedule, load_prompts
from gdnctl.runtime.rl.rollout.protocol import address_file
from tests.runtime.rl.test_rl_vllm import PRESET, SMALL_STEPS, VLLM_PYTHON, launch, metrics, needs_vllm, vllm_env

# The rollout on an engine of its own: the trainer on one CPU "GPU", the engine on the other.
SEPARATE = ("cluster.gpus_per_node=2", "rollout.colocate=false", "rollout.num_gpus=1")
PROMPTS = Path(__file__).resolve().parents[3] / "examples" / "toy-rl" / "prompts.jsonl"


@needs_vllm
def test_trainer_and_engine_score_the_tempered_distribution_that_was_sampled(ppo_run):
    """At temperature 0.7 (the PPO job's, tests/runtime/rl/conftest.py) the engine reports the processed (tempered)
    log-probs and the trainer divides its logits by 0.7: the two agree on every sampled token as closely as at
    temperature 1 (the preset's, which the main test in test_rl_vllm.py holds to the same bound). Untempered, the
    gap at 0.7 measured 0.5-0.6 nats/token."""
    run_dir, done = ppo_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["rollout_logprob_abs_diff"] < 0.01 for s in steps), [s["rollout_logprob_abs_diff"] for s in steps]
    assert all(s["probe_logprob_abs_diff"] < 0.01 for s in steps)  # the probe scores at temperature 1 on both sides


def _schedule(seed: int = 1234, prompts_per_step: int = 4) -> PromptSchedule:
    return PromptSchedule(load_prompts(PROMPTS), prompts_per_step, seed=seed)


def _digest(schedule: PromptSchedule, step: int) -> str:
    """The metrics' name of the batch of the schedule's step `step` (no dynamic sampling: its own prompts)."""
    return prompts_digest(tuple(record.line for record in schedule.batch(step).records))


@needs_vllm
def test_off_policy_steps_overlap_the_next_rollout_and_a_resume_trains_the_batch_in_flight_once(tmp_path):
    """max_staleness 1 on an engine of its own: step k + 1's rollout starts before step k's update ends, every sample
    is at most one version old (exactly one from the second step on), and the decoupled objective's importance
    weight is on. Stopped after 2 steps with step 3's batch in flight, the job resumed to 4 trains steps 3 and 4 on
    exactly the batches of the schedule's steps 2 and 3: none trained twice, none skipped."""
    save_dir = tmp_path / "checkpoints"
    off_policy = (*SMALL_STEPS, *SEPARATE, "rollout.max_staleness=1", "eval=null", f"train.save_dir={save_dir}")
    first = launch(tmp_path / "first", *off_policy, "train.train_iters=2")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    steps = metrics(tmp_path / "first")
    # Step 2's rollout went out at the start (version 0 allows steps 0 and 1) and ran while step 1 trained.
    assert steps[1]["rollout_began_s"] < steps[0]["train_ended_s"], steps
    assert [s["staleness_max"] for s in steps] == [0, 1]
    assert all(s["tis_mean"] is not None for s in steps)
    schedule = _schedule()
    assert [s["prompts_digest"] for s in steps] == [_digest(schedule, k) for k in (0, 1)]

    resumed = launch(tmp_path / "resumed", *off_policy, "train.train_iters=4")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "at step 2" in resumed.stdout
    later = metrics(tmp_path / "resumed")
    assert [s["step"] for s in later] == [3, 4]
    assert [s["prompts_digest"] for s in later] == [_digest(schedule, k) for k in (2, 3)]
    assert later[1]["staleness_max"] == 1


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _logged_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _server_pid(run_dir: Path, other_than: int | None = None) -> int | None:
    try:
        pid = json.loads(address_file(run_dir).read_text())["pid"]
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return pid if pid != other_than else None


@needs_vllm
def test_an_engine_that_dies_or_hangs_is_restarted_and_the_job_goes_on(tmp_path):
    """The rollout server is killed after the first step and stopped (SIGSTOP: no answer, no token) after the
    second: each time the stream notices (the exit at once, the hang after rollout.stall_timeout_s), starts the
    engine again on the current weights, sends its requests again, and the job ends its steps with a line per
    restart and the count in metrics."""
    run_dir = tmp_path / "run"
    sets = (
        *SMALL_STEPS,
        "train.train_iters=3",
        "eval=null",
        "rollout.stall_timeout_s=10",
        f"rollout.python={VLLM_PYTHON}",
    )
    command = [sys.executable, "-m", "gdnctl", "launch", PRESET, "-o", str(run_dir), "--force"]
    job = subprocess.Popen(
        [*command, *(arg for value in sets for arg in ("--set", value))],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=vllm_env(),
    )
    stopped = None
    try:
        _wait(lambda: _logged_steps(run_dir) >= 1, 900, "step 1")
        first = _server_pid(run_dir)
        os.kill(first, signal.SIGKILL)
        _wait(lambda: _logged_steps(run_dir) >= 2, 900, "step 2 after the restart")
        stopped = _wait(lambda: _server_pid(run_dir, other_than=first), 60, "the restarted server's address")
        os.kill(stopped, signal.SIGSTOP)
        output, _ = job.communicate(timeout=900)
    finally:
        if job.poll() is None:
            job.kill()
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert job.returncode == 0, output[-4000:]
    restarts = [line for line in output.splitlines() if "restarted it in" in line]
    assert len(restarts) == 2, restarts
    assert "was killed by SIGKILL" in restarts[0] or "closed the connection" in restarts[0], restarts[0]
    assert "rollout.stall_timeout_s" in restarts[1], restarts[1]
    assert all("(restart" in line and "rollout.max_engine_restarts 2" in line for line in restarts)
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert steps[-1]["engine_restarts"] == 2
    # The restarted engines serve the synced weights: checked after every sync, and the samples stay on policy.
    assert all(s["probe_logprob_abs_diff"] < 0.01 and s["rollout_logprob_abs_diff"] < 0.01 for s in steps)


@needs_vllm
def test_dynamic_sampling_drops_uniform_groups_and_overlong_shaping_penalises_and_masks(tmp_path):
    """The toy reward is the share of digits, so a pair of responses without a digit and cut at the same length is
    a uniform group: dynamic sampling drops such groups and draws further prompts. Nearly every response runs into
    the toy's 16-token limit and its over-long buffer, so it is penalised, and the truncated ones take no loss."""
    done = launch(
        tmp_path / "run",
        *SMALL_STEPS,
        "rollout.n_samples_per_prompt=2",  # 8 groups of 2 a step: a uniform one is common at the random start
        "train.train_iters=3",
        "eval=null",
        "grpo.dynamic_sampling={max_rounds: 3}",
        "grpo.overlong={buffer_tokens: 4, penalty: 0.5, mask_truncated: true}",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = metrics(tmp_path / "run")
    assert sum(s["dropped_groups"] for s in steps) > 0, [s["dropped_groups"] for s in steps]
    assert all(s["sampling_rounds"] >= 2 for s in steps if s["dropped_groups"])  # a drop draws a further round
    assert all(s["overlong_penalty"] < 0 for s in steps)
    assert all(s["masked_samples"] >= s["truncated_samples"] > 0 for s in steps)


@needs_vllm
def test_a_partial_rollout_job_trains_within_the_staleness_bound_on_the_engines_checked_weights(tmp_path):
    """A partial-rollout job end to end: responses that run to their length (the preset's tokenizer without its
    end-of-text token, 1,000 tokens), the next step's generation beside the update, every step within the bound
    and every sync checked by the probe.

    Whether a sync here finds requests in flight to continue is a race between the trainer and vLLM's decoding on
    2 shared cores, and it went either way (continued samples in some runs, none in others, even with vLLM's
    engine stopped across the update), so this test does not count them; the continuation itself, tokens before
    the update under the old weights and after it under the new over the re-prefilled prefix, is proven at the
    server, where the test chooses the moment (tests/runtime/rl/test_rollout_streaming.py)."""
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(PROMPTS.parent / "tokenizer", tokenizer)
    spec = json.loads((tokenizer / "tokenizer.json").read_text())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "<|endoftext|>"]
    (tokenizer / "tokenizer.json").write_text(json.dumps(spec))
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    done = launch(
        tmp_path / "run",
        *SEPARATE,
        f"model.tokenizer={tokenizer}",
        "rollout.max_staleness=1",
        "rollout.partial=true",
        "train.global_batch_size=2",
        "train.micro_batch_size=2",
        "rollout.n_samples_per_prompt=2",
        "train.seq_length=1024",
        "rollout.max_response_tokens=1000",
        "train.train_iters=4",
        "eval=null",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = metrics(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(s["response_length"] == 1000 for s in steps)  # no response ended early
    assert all(s["staleness_max"] <= 1 for s in steps)
    assert all(s["probe_logprob_abs_diff"] < 0.01 for s in steps)
