"""The environment each loop runs with.

gdnctl's launch scripts export the variables of the engine config's `env` (gdnctl/plan/compile.py engine_env): its
decisions' switches (the allocator's expandable segments, NCCL_GRAPH_REGISTER=0, TORCH_NCCL_ASYNC_ERROR_HANDLING=1,
OMP_NUM_THREADS=1, and speed.cutlass_grouped_gemm's NVTE_USE_CUTLASS_GROUPED_GEMM=1, measured at 2-5.6% of the
proxy's step), then the compiler caches under launch.kernel_cache_dir with Triton's autotuning cache switch
(plan/decisions.py kernel_cache_env), then the preset's launch.env. Every one of them is something a Megatron-Bridge
user can set too, so the peer gets them all; only the cache locations are its own (the same layout under its own
directory), so that neither loop finds the other's compiled kernels.
"""

from __future__ import annotations

from gdnctl.plan.decisions import kernel_cache_env

from .plan import PEER_GDN_ENV

# Variables that name where a compiler keeps its cache: not a switch, and never shared between the loops.
CACHE_LOCATIONS = frozenset(
    name for name, value, _ in kernel_cache_env("/cache", rollout=True) if value.startswith("/cache")
)
# What picks the GDN kernel inside FLA: the pairing sets it (plan.py), so it is shown with the kernel, not as a switch.
KERNEL_SELECTION = frozenset(name for env in PEER_GDN_ENV.values() for name in env)


def peer_environment(gdnctl_env: dict[str, str], peer_cache_dir: str, kernel: str) -> dict[str, str]:
    """What the peer's process gets on top of the campaign's own environment: gdnctl's switches, its kernel
    cache's layout under `peer_cache_dir`, and the GDN kernel's FLA_FLASH_QLA."""
    switches = {name: value for name, value in gdnctl_env.items() if name not in CACHE_LOCATIONS}
    caches = {name: value for name, value, _ in kernel_cache_env(peer_cache_dir)}
    return {**switches, **caches, **PEER_GDN_ENV[kernel]}


def switch_difference(gdnctl_env: dict[str, str], peer_env: dict[str, str]) -> dict[str, dict]:
    """The switches (cache locations and the kernel's selection aside) both loops ran with, and those only one of
    them had or had set differently: a like-for-like campaign has none that gdnctl alone had."""
    apart = CACHE_LOCATIONS | KERNEL_SELECTION
    ours = {name: value for name, value in gdnctl_env.items() if name not in apart}
    theirs = {name: value for name, value in peer_env.items() if name not in apart}
    return {
        "both": {name: value for name, value in sorted(ours.items()) if theirs.get(name) == value},
        "gdnctl_only": {name: value for name, value in sorted(ours.items()) if name not in theirs},
        "peer_only": {name: value for name, value in sorted(theirs.items()) if name not in ours},
        "different": {
            name: {"gdnctl": value, "peer": theirs[name]}
            for name, value in sorted(ours.items())
            if name in theirs and theirs[name] != value
        },
    }
