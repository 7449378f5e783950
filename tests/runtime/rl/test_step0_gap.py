"""The rl job's step-0 check: a fresh run whose trainer and rollout disagree on the first step's samples stops
there, with a sentence, before anything is saved."""

from __future__ import annotations

import pytest

from gdnctl.runtime.rl.algorithm.logprob_gap import LogprobGapError, check_step0_gap
from tests.runtime.rl.test_rl_vllm import SMALL_STEPS, launch, needs_vllm


def test_the_gap_passes_under_the_threshold_and_when_the_check_is_off():
    check_step0_gap(0.0015, 0.05)
    check_step0_gap(0.05, 0.05)
    check_step0_gap(3.0, None)


def test_a_gap_over_the_threshold_is_a_sentence_with_the_numbers_the_field_and_the_causes():
    with pytest.raises(LogprobGapError) as caught:
        check_step0_gap(0.31, 0.05)
    sentence = str(caught.value)
    assert "0.3100 nats/token" in sentence and "rollout.max_step0_logprob_gap 0.05" in sentence
    for cause in ("HF naming", "dtype", "kernels"):
        assert cause in sentence
    assert caught.value.exit_code == 1


@needs_vllm
def test_a_real_run_over_the_threshold_stops_at_step_0_without_a_checkpoint(tmp_path):
    """An honest trigger: the real gap between the CPU policy and vLLM's CPU build (measured 0.0013-0.0023) is
    above a threshold of 1e-6."""
    save_dir = tmp_path / "checkpoints"
    done = launch(tmp_path / "run", *SMALL_STEPS, f"train.save_dir={save_dir}", "rollout.max_step0_logprob_gap=1e-6")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    sentence = next(line for line in done.stderr.splitlines() if line.startswith("gdnctl runtime:"))
    assert "on the first step the trainer scores the rollout's samples" in sentence
    assert "above rollout.max_step0_logprob_gap 1e-06" in sentence
    assert "step 1/" not in done.stdout  # no step was reported
    # No checkpoint (the save dir itself may exist: rank 0 holds a lock file in it while the job runs).
    assert not (save_dir / "latest").exists() and not list(save_dir.glob("iter_*"))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
