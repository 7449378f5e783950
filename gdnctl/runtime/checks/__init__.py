"""The checks every job makes on itself, below the jobs that import them (train/, rl/) and the smoke run that
drives those jobs (smoke/): the first-minute memory watch after the second optimizer step, and the verdicts
(functions of numbers, no torch) that the watch and the smoke run both give."""

from gdnctl.runtime.exports import lazy_attributes

_VERDICTS = (
    "CHECKPOINT",
    "KERNEL_WARM_UP",
    "MEMORY_MARGIN",
    "OPTIMIZER_STEPS",
    "PEAK_MEMORY",
    "SMOKE_STEPS",
    "START",
    "STEP0_GAP",
    "STEP_TIME",
    "WEIGHT_SYNC",
    "Checklist",
    "ExplainedMemory",
)
_HOMES = {
    "FirstMinuteWatch": "first_minute",
    "peak_memory_gib": "first_minute",
    **{name: "verdicts" for name in _VERDICTS},
}
__all__ = [*sorted(_HOMES), "first_minute", "verdicts"]
__getattr__ = lazy_attributes(__name__, _HOMES)
