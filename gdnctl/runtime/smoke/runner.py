"""`python -m gdnctl.runtime --config engine.yaml --smoke`: the job's smoke run and its verdicts.

The smoke run is the job itself, shortened (config.smoke_config): the preset's parallel layout, shapes, data and
kernels for SMOKE_STEPS optimizer steps, one checkpoint saved and loaded back, and for rl the rollout with its
checked weight syncs, all in RUN_DIR/smoke, so the job's checkpoints, metrics and W&B run never see it. What each
job checks: selftest its own check list; rl (rl_smoke) and sft / pretrain (train_smoke) that the job starts, the
optimizer steps (finite), the checkpoint round trip, for rl the weight syncs and the step-0 log-prob gap, and the
measured step time and peak memory against explain's estimate.

Rank 0 prints one line per check and a summary and writes RUN_DIR/smoke.json (schema/smoke.py), also when the
smoke stops at a failure, before the error goes on to end the run. The exit code is 0 only when no check failed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from gdnctl.runtime import selftest
from gdnctl.runtime.checks import Checklist
from gdnctl.runtime.smoke import rl_smoke, train_smoke
from gdnctl.runtime.smoke.config import CHECKPOINTS_DIR, smoke_config, smoke_run_dir
from gdnctl.runtime.train import METRICS_FILE, TENSORBOARD_DIR
from gdnctl.schema import SMOKE_FILE, EngineConfig, SmokeCheck

ENGINE_FILE = "engine.yaml"


@dataclass(frozen=True)
class SmokeRun:
    config: EngineConfig  # the smoke's engine config
    config_path: Path  # RUN_DIR/smoke/engine.yaml: the smoke's run dir is its parent
    report_path: Path  # RUN_DIR/smoke.json


def prepare_smoke(config: EngineConfig, config_path: Path) -> SmokeRun:
    """The smoke's config, written into RUN_DIR/smoke (collective: rank 0 writes, the others wait for it).

    A smoke run always starts fresh: an earlier smoke's checkpoint would be resumed (and no step taken), and its
    report or metrics mistaken for this one's. RUN_DIR/smoke/rollout stays: a rollout the Slurm script started as
    its own step may already have published its address there."""
    run_dir = config_path.parent
    directory = smoke_run_dir(run_dir)
    smoke = SmokeRun(smoke_config(config, run_dir), directory / ENGINE_FILE, run_dir / SMOKE_FILE)
    if dist.get_rank() == 0:
        smoke.report_path.unlink(missing_ok=True)
        shutil.rmtree(directory / CHECKPOINTS_DIR, ignore_errors=True)
        shutil.rmtree(directory / TENSORBOARD_DIR, ignore_errors=True)
        (directory / METRICS_FILE).unlink(missing_ok=True)
        directory.mkdir(parents=True, exist_ok=True)
        _write_atomically(smoke.config_path, smoke.config.to_yaml())
    dist.barrier()
    return smoke


def run_smoke(smoke: SmokeRun, comm_policy) -> int:
    """Run the smoke, report it (rank 0), and return 0 when no check failed, else 1, on every rank."""
    config = smoke.config
    checklist, report = None, None
    try:
        if config.job == "selftest":
            checklist = _selftest(config, comm_policy, smoke.config_path.parent)
        else:
            job = rl_smoke if config.job == "rl" else train_smoke
            checklist = Checklist(job.CHECKS)
            job.run(config, smoke.config_path, comm_policy, checklist)
    finally:
        if checklist is not None and dist.get_rank() == 0:
            report = checklist.report(config.job, dist.get_world_size())
            _write_atomically(smoke.report_path, report.model_dump_json(indent=2) + "\n")
            print("\n".join(report.lines()), flush=True)
    green = [report.green if report is not None else None]  # rank 0 decided every check
    dist.broadcast_object_list(green, src=0)
    return 0 if green[0] else 1


def _selftest(config: EngineConfig, comm_policy, run_dir: Path) -> Checklist:
    """The selftest is a check list already: its smoke run is that list."""
    results = selftest.check_all(config, comm_policy, run_dir)
    checklist = Checklist([result.name for result in results])
    for result in results:
        checklist.decide(SmokeCheck(name=result.name, status=result.status, detail=result.detail))
    return checklist


def _write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(temporary, path)
