"""What the compiler puts into the engine config for the runtime's first-minute checks and the smoke run."""

from __future__ import annotations

import pytest

from gdnctl.plan import compile_engine_config, memory_table
from gdnctl.validate import validate


def compiled(preset: str, *overrides: str):
    result = validate(preset, list(overrides))
    assert result.ok, [f.message for f in result.findings]
    return result.run, compile_engine_config(result.run)


def test_the_memory_estimate_is_explains_total():
    run, config = compiled("qwen3.5-35b-a3b-grpo")
    assert config.estimate.peak_memory_gib == pytest.approx(memory_table(run).total_gib, abs=1e-3)


def test_cpu_jobs_carry_no_estimate():
    _, config = compiled("tiny-qwen3.5-rl-cpu")
    assert config.estimate.peak_memory_gib is None


@pytest.mark.parametrize("value, compiled_value", [(None, None), (0, None), (0.2, 0.2)])
def test_the_step0_gap_threshold_is_off_at_zero_or_null(value, compiled_value):
    _, default = compiled("tiny-qwen3.5-rl-cpu")
    assert default.rollout.max_step0_logprob_gap == 0.05
    _, config = compiled("tiny-qwen3.5-rl-cpu", f"rollout.max_step0_logprob_gap={'null' if value is None else value}")
    assert config.rollout.max_step0_logprob_gap == compiled_value


def test_a_negative_threshold_is_refused():
    result = validate("tiny-qwen3.5-rl-cpu", ["rollout.max_step0_logprob_gap=-0.1"])
    assert [f.code for f in result.findings if f.path == "rollout.max_step0_logprob_gap"] == ["PRE002"]
