"""The rl job's smoke run: the real job (RlJob) for SMOKE_STEPS GRPO steps on the smoke's engine config.

What it runs is the job's own code: the first weight sync starts the rollout and checks checksums and the probe,
each step is rolled out, scored (with the step-0 log-prob gap check), updated and synced again, and the last
step's checkpoint is saved; the smoke then loads that checkpoint back and compares it with the policy in memory.
A check the job itself enforces (weight sync, step-0 gap) fails the smoke with the job's own sentence.
"""

from __future__ import annotations

import time
from pathlib import Path

from gdnctl.runtime.checks import (
    CHECKPOINT,
    OPTIMIZER_STEPS,
    PEAK_MEMORY,
    START,
    STEP0_GAP,
    STEP_TIME,
    WEIGHT_SYNC,
    Checklist,
    verdicts,
)
from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.rl import RlJob, make_policy
from gdnctl.runtime.rl.algorithm import logprob_gap
from gdnctl.runtime.rl.weights import sync as weight_sync
from gdnctl.runtime.smoke import round_trip
from gdnctl.schema import EngineConfig

CHECKS = (START, WEIGHT_SYNC, STEP0_GAP, OPTIMIZER_STEPS, CHECKPOINT, STEP_TIME, PEAK_MEMORY)
# Errors the job raises for a check of its own, by the check they fail; any other error fails the stage it came in.
_FAILED_CHECK = {weight_sync.WeightSyncError: WEIGHT_SYNC, logprob_gap.LogprobGapError: STEP0_GAP}


def run(config: EngineConfig, config_path: Path, comm_policy, checklist: Checklist) -> None:
    """Run the smoke on every rank, deciding `checklist`'s checks on rank 0; a failure is recorded, then raised."""
    stage = START
    try:
        began = time.perf_counter()
        job = RlJob(config, config_path, comm_policy)
        ready = time.perf_counter() - began
        checklist.decide(verdicts.started(f"policy, tokenizer and prompts ready in {ready:.1f} s"))
        try:
            stage = WEIGHT_SYNC
            first = job.start_rollout()
            syncs = [] if first is None else [(first[0].checked, first[0].total, first[1])]
            if syncs:
                checklist.decide(verdicts.weight_sync(syncs, config.rollout.probe_tolerance))
            stage = OPTIMIZER_STEPS
            job.train()
            if syncs:
                _decide_steps(checklist, job, config, syncs)
            stage = CHECKPOINT
            result = round_trip.gathered(_round_trip(job, config, config_path, comm_policy))
            checklist.decide(
                verdicts.checkpoint_round_trip(
                    result.checkpoint, result.weights, result.optimizer, result.step, result.problems
                )
            )
        finally:
            job.close()
    except Exception as error:
        checklist.fail(next((name for kind, name in _FAILED_CHECK.items() if isinstance(error, kind)), stage), error)
        raise


def _decide_steps(checklist: Checklist, job: RlJob, config: EngineConfig, syncs: list) -> None:
    """Rank 0, after the steps: their stats (job.reported) and the first-minute memory measurement."""
    steps = job.reported
    total = syncs[0][1]
    syncs += [(s.synced_parameters, total, s.probe_logprob_abs_diff) for s in steps]
    checklist.decide(verdicts.weight_sync(syncs, config.rollout.probe_tolerance))
    checklist.decide(
        verdicts.step0_logprob_gap(steps[0].rollout_logprob_abs_diff, config.rollout.max_step0_logprob_gap)
    )
    checklist.decide(verdicts.optimizer_steps([s.loss for s in steps], [s.grad_norm for s in steps]))
    last = steps[-1]
    seconds = last.rollout_seconds + last.train_seconds + last.sync_seconds
    parts = f"rollout {last.rollout_seconds:.2f} s, update {last.train_seconds:.2f} s, sync {last.sync_seconds:.2f} s"
    checklist.decide(verdicts.step_time(seconds, last.step, parts, last.mfu))
    checklist.decide(job.first_minute.verdict())
    checklist.measured = job.first_minute.measured(seconds)


def _round_trip(job: RlJob, config: EngineConfig, config_path: Path, comm_policy) -> round_trip.RoundTrip:
    """This rank's comparison of the policy in memory with the checkpoint the last step saved."""
    directory = checkpoint.latest_checkpoint(Path(config.train.save_dir))
    if directory is None:
        raise checkpoint.CheckpointError(f"the smoke's last step saved no checkpoint into {config.train.save_dir}.")
    if config.device == "cuda":
        return round_trip.reload_in_place(job.policy.trainer, directory)
    before = round_trip.state_checksums(job.policy.module, job.policy.optimizer)
    resumed = make_policy(config, config_path, comm_policy)  # resumes from `directory`, as a restarted job would
    after = round_trip.state_checksums(resumed.module, resumed.optimizer)
    return round_trip.compare(directory, before, after, resumed.step, job.step)
