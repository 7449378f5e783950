"""The smoke run (`--smoke`: a few steps of the job's real layout, a checkpoint round trip, for rl the weight
syncs, verdicts in RUN_DIR/smoke.json) and the first-minute memory check every job makes after its second step."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {"SMOKE_STEPS": "config", "smoke_config": "config", "smoke_run_dir": "config",
          "FirstMinuteWatch": "first_minute", "peak_memory_gib": "first_minute", "SmokeRun": "runner",
          "prepare_smoke": "runner", "run_smoke": "runner", "Checklist": "verdicts", "MEMORY_MARGIN": "verdicts"}
__all__ = ["Checklist", "FirstMinuteWatch", "MEMORY_MARGIN", "SMOKE_STEPS", "SmokeRun", "config", "first_minute",
           "peak_memory_gib", "prepare_smoke", "rl_smoke", "round_trip", "run_smoke", "runner", "smoke_config",
           "smoke_run_dir", "train_smoke", "verdicts"]
__getattr__ = lazy_attributes(__name__, _HOMES)
