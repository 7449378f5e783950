"""PPO updates over a rollout batch (runtime/rl/algorithm/updates.py) with the CPU policy on a real one-rank gloo group:
from the second mini-batch on the policy has moved off the one that sampled, so the ratio clip acts; with one update it
cannot."""

from __future__ import annotations

import pytest

from gdnctl.runtime.rl.algorithm.batch import Sample
from gdnctl.schema.engine import EngineConfig


def samples() -> list[Sample]:
    """Eight samples of four prompts, advantages of both signs, rollout log-probs near the random model's."""
    rows = [
        ((81, 58, 32), (49, 50, 51)),
        ((81, 58), (55, 56, 57, 58)),
        ((81, 58, 32, 51), (52, 53)),
        ((70, 71), (48, 49)),
        ((72, 73, 74), (50, 51, 52)),
        ((75, 76), (53, 54)),
        ((77, 78), (55, 56, 57)),
        ((79, 80, 81), (58, 59)),
    ]
    advantages = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.5, -0.5]
    return [
        Sample(i // 2, prompt, response, tuple(-5.5 for _ in response), "stop", 0.0, advantages[i])
        for i, (prompt, response) in enumerate(rows)
    ]


def _run(engine: EngineConfig, **grpo) -> dict:
    from gdnctl.runtime.rl.algorithm import updates
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

    config = engine.model_copy(update={"grpo": engine.grpo.model_copy(update=grpo)})
    policy = TorchPolicy(config)
    return updates.update(policy, samples(), config, lr=config.train.lr, pad_id=256, row_multiple=1)


def test_the_clip_acts_once_the_policy_has_moved_off_the_sampling_one(engine, gloo):
    stats = _run(engine, mini_batches=2, epochs=2)
    assert stats["updates"] == 4
    assert stats["clip_fraction"] > 0, stats
    assert stats["approx_kl"] > 0, stats
    assert stats["ratio_max"] > 1 + engine.grpo.clip_high or stats["ratio_min"] < 1 - engine.grpo.clip_low, stats
    # The gap to the rollout is the sampling policy's, measured before any update.
    single = _run(engine)
    assert stats["rollout_logprob_abs_diff"] == pytest.approx(single["rollout_logprob_abs_diff"], rel=1e-6)


def test_two_mini_batches_in_one_epoch_already_clip(engine, gloo):
    stats = _run(engine, mini_batches=2)
    assert stats["updates"] == 2 and stats["clip_fraction"] > 0, stats


def test_one_update_per_rollout_batch_never_clips(engine, gloo):
    stats = _run(engine)
    assert stats["updates"] == 1
    assert stats["clip_fraction"] == 0 and stats["approx_kl"] == 0
    assert stats["ratio_min"] == stats["ratio_max"] == 1.0


def test_rollout_correction_weights_tokens_by_the_capped_trainer_over_rollout_ratio(engine, gloo):
    # The rollout log-probs (-5.5) are below the random model's (about -log 257 = -5.55 .. -5.5), so weights sit
    # near 1; a cap of 1 cuts every weight above it.
    off = _run(engine)
    on = _run(engine, rollout_correction=True, rollout_correction_cap=1.0)
    assert "tis_mean" not in off and 0 < on["tis_mean"] <= 1.0
    assert 0 <= on["tis_capped_fraction"] <= 1
    assert on["loss"] != off["loss"]


def test_a_batch_that_does_not_split_into_the_mini_batches_is_refused_with_the_fix():
    from gdnctl.runtime.rl.algorithm.updates import split_mini_batches

    with pytest.raises(ValueError, match="grpo.mini_batches"):
        split_mini_batches(samples(), 3)
    assert [len(part) for part in split_mini_batches(samples(), 4)] == [2, 2, 2, 2]
