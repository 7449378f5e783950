"""The smoke run (`--smoke`: a few steps of the job's real layout, a checkpoint round trip, for rl the weight
syncs, verdicts in RUN_DIR/smoke.json). It drives the jobs (train/, rl/), so it sits above them; the checks the
jobs make on themselves (the first-minute watch, the verdicts) live below them, in runtime/checks."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "SMOKE_STEPS": "config",
    "smoke_config": "config",
    "smoke_run_dir": "config",
    "SmokeRun": "runner",
    "prepare_smoke": "runner",
    "run_smoke": "runner",
}
__all__ = [
    "SMOKE_STEPS",
    "SmokeRun",
    "config",
    "prepare_smoke",
    "rl_smoke",
    "round_trip",
    "run_smoke",
    "runner",
    "smoke_config",
    "smoke_run_dir",
    "train_smoke",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
