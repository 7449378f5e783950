"""The rl job: GRPO over vLLM rollouts. The loop (`job`) trains a `Policy` (torch on CPU, Megatron on GPUs),
talks to the rollout server over an authenticated socket, and syncs and checks the weights after every step."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "Policy": "policy",
    "make_policy": "policy",
    "RlJob": "job",
    "RlBatch": "batch",
    "RolloutClient": "rollout_protocol",
    "TorchPolicy": "torch_policy",
    "MegatronPolicy": "megatron_policy",
}
__all__ = [
    "MegatronPolicy",
    "Policy",
    "RlBatch",
    "RlJob",
    "RolloutClient",
    "TorchPolicy",
    "batch",
    "chat_template",
    "grpo",
    "job",
    "logprob_gap",
    "make_policy",
    "prompts",
    "rewards",
    "rollout_protocol",
    "rollout_server",
    "weight_sync",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
