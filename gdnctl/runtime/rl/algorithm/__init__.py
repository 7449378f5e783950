"""The learning rule, torch-only and engine-free: samples and their training rows (`batch`), GRPO's advantages,
losses, KL and log-probs (`grpo`), the shipped rewards (`rewards`), PPO's mini-batches and epochs over a rollout
batch (`updates`), and the step-0 check that trainer and rollout score the same policy (`logprob_gap`)."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "RlBatch": "batch",
    "Sample": "batch",
    "REWARDS": "rewards",
    "get_reward": "rewards",
    "LogprobGapError": "logprob_gap",
    "check_step0_gap": "logprob_gap",
}
__all__ = [
    "LogprobGapError",
    "REWARDS",
    "RlBatch",
    "Sample",
    "batch",
    "check_step0_gap",
    "get_reward",
    "grpo",
    "logprob_gap",
    "rewards",
    "updates",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
