"""The rollout: vLLM engines in their own environment, and how the trainer reaches them. Where the engines run
and which trainer rank drives each (`engine_layout`), the trainer's side of every engine (`engines`), trainer rank
0's stream of requests to them and their restarts (`stream`), the wire between them (`protocol`: stdlib only, shared
by both environments; its docstring is the contract an engine fills), the server that runs one engine (`server`, in
vLLM's environment) and the engine itself, on vLLM's asynchronous engine (`vllm_engine`), the process group each
spawned server runs in, which ends with the job (`server_group`: stdlib only, run as a script by the rollout's
interpreter), and multi-turn episodes with the user's environment through the engines (`episodes`)."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "EpisodeError": "episodes",
    "Episodes": "episodes",
    "RolloutEngines": "engines",
    "EXTERNAL": "protocol",
    "LOCAL": "protocol",
    "ROLLOUT_ENV": "protocol",
    "RolloutClient": "protocol",
    "RolloutError": "protocol",
    "rollout_dir": "protocol",
    "Outgoing": "stream",
    "RolloutStream": "stream",
}
__all__ = [
    "EXTERNAL",
    "EpisodeError",
    "Episodes",
    "LOCAL",
    "Outgoing",
    "ROLLOUT_ENV",
    "RolloutClient",
    "RolloutEngines",
    "RolloutError",
    "RolloutStream",
    "engine_layout",
    "engines",
    "episodes",
    "protocol",
    "rollout_dir",
    "server",
    "server_group",
    "stream",
    "vllm_engine",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
