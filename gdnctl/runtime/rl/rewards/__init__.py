"""What scores the rl job's samples, whichever grpo.reward names: the shipped rules (`shipped`, one table entry
each), the user's function in a pool of worker processes with limits (`pool`, each process running `worker`), a
reward server over HTTP (`http_client`), what every scorer takes and gives (`results`), and one batch's samples
through a scorer as they arrive, with failures handled as the preset says (`scoring`)."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "REWARDS": "shipped",
    "get_reward": "shipped",
    "FunctionPool": "pool",
    "ServerScorer": "http_client",
    "RewardServerError": "http_client",
    "RewardRequest": "results",
    "RewardResult": "results",
    "RewardFunctionError": "scoring",
    "StepRewards": "scoring",
    "make_scorer": "scoring",
}
__all__ = [
    "FunctionPool",
    "REWARDS",
    "RewardFunctionError",
    "RewardRequest",
    "RewardResult",
    "RewardServerError",
    "ServerScorer",
    "StepRewards",
    "get_reward",
    "http_client",
    "make_scorer",
    "pool",
    "results",
    "scoring",
    "shipped",
    "worker",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
