"""The smoke run's engine config: the job's own, shortened and pointed at a run dir of its own.

Torch-free: the rollout server (`--role rollout --smoke`, in vLLM's environment) derives the same config.
"""

from __future__ import annotations

from pathlib import Path

from gdnctl.runtime.checks import SMOKE_STEPS
from gdnctl.schema import SMOKE_DIR, EngineConfig

CHECKPOINTS_DIR = "checkpoints"


def smoke_run_dir(run_dir: Path) -> Path:
    return run_dir / SMOKE_DIR


def smoke_config(config: EngineConfig, run_dir: Path) -> EngineConfig:
    """The job's layout, shapes, data and kernels for SMOKE_STEPS steps, saving once at the end into
    RUN_DIR/smoke/checkpoints (never the job's save_dir). W&B, when the job logs to it, runs offline into
    RUN_DIR/smoke/wandb: the sink is exercised without adding the smoke's steps to the job's project."""
    train = config.train.model_copy(
        update={
            "train_iters": SMOKE_STEPS,
            "save_dir": str(smoke_run_dir(run_dir) / CHECKPOINTS_DIR),
            "save_interval": None,
        }
    )
    metrics = config.metrics
    if metrics.wandb_project is not None:
        metrics = metrics.model_copy(update={"wandb_mode": "offline"})
    return config.model_copy(update={"train": train, "metrics": metrics})
