"""The learning rule, torch-only and engine-free: samples and their training rows (`batch`), GRPO's advantages,
losses, KL and log-probs (`grpo`), PPO's mini-batches and epochs over a rollout batch (`updates`), the step-0
check that trainer and rollout score the same policy (`logprob_gap`), the samples' seeds, DAPO's over-long penalty
and the staleness bound (`sampling`), and one step's batch as its samples arrive, with dynamic sampling
(`step_batch`). What scores the samples is rl/rewards/."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "PromptPixels": "batch",
    "RlBatch": "batch",
    "Sample": "batch",
    "Turn": "batch",
    "LogprobGapError": "logprob_gap",
    "check_step0_gap": "logprob_gap",
    "Request": "step_batch",
    "StepBatch": "step_batch",
    "StepStats": "step_batch",
}
__all__ = [
    "LogprobGapError",
    "PromptPixels",
    "Request",
    "RlBatch",
    "Sample",
    "StepBatch",
    "StepStats",
    "Turn",
    "batch",
    "check_step0_gap",
    "grpo",
    "logprob_gap",
    "sampling",
    "step_batch",
    "updates",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
