"""The sft / pretrain smoke run: the Megatron trainer for SMOKE_STEPS steps on the smoke's engine config.

The trainer's own start-up (parallel groups, model build, weights, kernel warm-up), steps and save run unchanged;
the smoke then loads the saved checkpoint back into the same model and optimizer and compares them with what was
in memory (round_trip.reload_in_place: on a GPU a second copy of the model would not fit).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch.distributed as dist

from gdnctl.runtime.checks import (
    CHECKPOINT,
    KERNEL_WARM_UP,
    OPTIMIZER_STEPS,
    PEAK_MEMORY,
    START,
    STEP_TIME,
    Checklist,
    verdicts,
)
from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.smoke import round_trip
from gdnctl.runtime.train import Trainer
from gdnctl.schema import EngineConfig

CHECKS = (START, KERNEL_WARM_UP, OPTIMIZER_STEPS, CHECKPOINT, STEP_TIME, PEAK_MEMORY)


def run(config: EngineConfig, config_path: Path, comm_policy, checklist: Checklist) -> None:
    """Run the smoke on every rank, deciding `checklist`'s checks; a failure is recorded, then raised."""
    trainer = Trainer(config, config_path, comm_policy)
    stage = START
    try:
        began = time.perf_counter()
        trainer.setup()
        ranks = dist.get_world_size()
        checklist.decide(
            verdicts.started(
                f"model built and loaded on {ranks} rank{'s' if ranks != 1 else ''} in "
                f"{time.perf_counter() - began:.1f} s"
            )
        )
        stage = KERNEL_WARM_UP
        warm = trainer.warm_up_kernel()
        checklist.decide(verdicts.kernel_warm_up(warm.kernel, warm.first_call_s, warm.warm_call_s))
        stage = OPTIMIZER_STEPS
        trainer.train()
        _decide_steps(checklist, trainer)
        stage = CHECKPOINT
        directory = checkpoint.latest_checkpoint(Path(config.train.save_dir))
        if directory is None:
            raise checkpoint.CheckpointError(f"the smoke's last step saved no checkpoint into {config.train.save_dir}.")
        result = round_trip.gathered(round_trip.reload_in_place(trainer, directory))
        checklist.decide(
            verdicts.checkpoint_round_trip(
                result.checkpoint, result.weights, result.optimizer, result.step, result.problems
            )
        )
    except Exception as error:
        checklist.fail(stage, error)
        raise
    finally:
        trainer.close()


def _decide_steps(checklist: Checklist, trainer: Trainer) -> None:
    steps = trainer.step_stats
    checklist.decide(
        verdicts.optimizer_steps(
            [s.loss for s in steps], [s.grad_norm for s in steps], skipped=sum(s.skipped for s in steps)
        )
    )
    last = steps[-1]
    checklist.decide(verdicts.step_time(last.seconds, last.iteration, f"{last.tokens_per_second:,.0f} tok/s", last.mfu))
    checklist.decide(trainer.first_minute.verdict())
    checklist.measured = trainer.first_minute.measured(last.seconds)
