"""From a preset to a planned run: the defaults decided from the preset and the GPU (`decisions`), the resolved
Run the rules reason about (`run`), the engine config built from it (`compile`), the memory estimate and
`gdnctl explain`'s derived values."""

from gdnctl.plan import decisions, memory
from gdnctl.plan.compile import compile_engine_config, engine_env
from gdnctl.plan.decisions import (
    DEFAULT_KERNEL_CACHE,
    Decision,
    cuda_device_max_connections,
    kernel_cache_env,
)
from gdnctl.plan.explain import Derived, derived_values, memory_table
from gdnctl.plan.memory import RESIDENT_ROWS, MemoryEstimate, estimate_training
from gdnctl.plan.run import Run, resolve

__all__ = [
    "DEFAULT_KERNEL_CACHE",
    "RESIDENT_ROWS",
    "Decision",
    "Derived",
    "MemoryEstimate",
    "Run",
    "compile_engine_config",
    "cuda_device_max_connections",
    "decisions",
    "derived_values",
    "engine_env",
    "estimate_training",
    "kernel_cache_env",
    "memory",
    "memory_table",
    "resolve",
]
