"""Multi-turn environments of the user's (rollout.environment.class): the contract their class implements and how
the rollout reads what it returns (`contract`). The rollout's runner (rollout/episodes.py) drives the turns."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "Ending": "contract",
    "Environment": "contract",
    "EnvironmentFailure": "contract",
    "Observation": "contract",
    "read_limit_reward": "contract",
    "read_messages": "contract",
    "read_step": "contract",
}
__all__ = [
    "Ending",
    "Environment",
    "EnvironmentFailure",
    "Observation",
    "contract",
    "read_limit_reward",
    "read_messages",
    "read_step",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
