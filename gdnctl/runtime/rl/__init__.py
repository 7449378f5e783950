"""The rl job: GRPO over vLLM rollouts. The loop (`job`) trains a `Policy` (`policy/`: torch on CPU, Megatron on
GPUs) on the samples of the rollout's engines (`rollout/`, multi-turn episodes with an environment included),
which `feed` sends out and scores as they finish (`rewards/`: the shipped rules, the user's function in worker
processes, a reward server), turns them into losses (`algorithm/`), and syncs and checks the weights after every
step (`weights/`); `prompts/` is the dataset, `environments/` the contract a multi-turn environment implements,
`evaluation` the held-out check, `user_code` how the user's code a preset names is imported, `network` where a
process listens for a peer on another node.

Inside rl the parts are ranked as the runtime's subpackages are (RL_RANK in tests/test_architecture.py): network
and user_code at the bottom; prompts, algorithm, weights, rewards and environments above them; rollout and policy
above those; evaluation and feed above them; job on top."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "RlJob": "job",
    "Policy": "policy",
    "make_policy": "policy",
    "TorchPolicy": "policy",
    "MegatronPolicy": "policy",
    "RlBatch": "algorithm",
    "RolloutClient": "rollout",
}
__all__ = [
    "MegatronPolicy",
    "Policy",
    "RlBatch",
    "RlJob",
    "RolloutClient",
    "TorchPolicy",
    "algorithm",
    "environments",
    "evaluation",
    "feed",
    "job",
    "make_policy",
    "network",
    "policy",
    "prompts",
    "rewards",
    "rollout",
    "user_code",
    "weights",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
