"""The learning rule, torch-only and engine-free: samples and their training rows (`batch`), GRPO's advantages,
losses, KL and log-probs (`grpo`), PPO's mini-batches and epochs over a rollout batch (`updates`), and the step-0
check that trainer and rollout score the same policy (`logprob_gap`). What scores the samples is rl/rewards/."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "RlBatch": "batch",
    "Sample": "batch",
    "Turn": "batch",
    "LogprobGapError": "logprob_gap",
    "check_step0_gap": "logprob_gap",
}
__all__ = [
    "LogprobGapError",
    "RlBatch",
    "Sample",
    "Turn",
    "batch",
    "check_step0_gap",
    "grpo",
    "logprob_gap",
    "updates",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
