"""The learning rate of every job (sft, pretrain, rl): a linear warmup, then a decay to min_lr.

A pure function of the step, so a resumed or requeued job picks the schedule up where it was from the step count
its checkpoint carries (trainer_state.json's `iteration`), with no scheduler state of its own to save.

Step s (0-based: optimizer steps already taken; for rl, rollout steps, each of which may take several optimizer
steps over mini-batches at one lr) gets:

    s <  warmup:  lr * (s + 1) / warmup                   (the first step already moves: lr / warmup, not 0)
    s >= warmup:  min_lr + (lr - min_lr) * f(p),  p = (s - warmup) / (total - warmup) in [0, 1)
                  cosine f = (1 + cos(pi p)) / 2,  linear f = 1 - p,  constant: lr

Megatron-Core's OptimizerParamScheduler (megatron/core/optimizer_param_scheduler.py) has the same shapes; it starts
the warmup at 0 (its first update is taken at lr 0), which this schedule does not.
"""

from __future__ import annotations

import math

DECAYS = ("cosine", "linear", "constant")


def lr_at(step: int, *, lr: float, warmup_steps: int, decay: str, min_lr: float, total_steps: int) -> float:
    """The lr of the update taken at `step` (0-based) of a `total_steps` job."""
    if decay not in DECAYS:
        raise ValueError(f"Unknown lr decay {decay!r}; use one of {', '.join(DECAYS)}.")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if decay == "constant":
        return lr
    span = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / span, 1.0)
    factor = 0.5 * (1.0 + math.cos(math.pi * progress)) if decay == "cosine" else 1.0 - progress
    return min_lr + (lr - min_lr) * factor


def lr_of(train, step: int) -> float:
    """lr_at with the engine config's train section (EngineTrain) as the schedule."""
    return lr_at(
        step,
        lr=train.lr,
        warmup_steps=train.lr_warmup_steps,
        decay=train.lr_decay,
        min_lr=train.min_lr,
        total_steps=train.train_iters,
    )


def set_lr(optimizer, lr: float) -> None:
    """Every param group of a torch optimizer (or Megatron's, which exposes its groups the same way) at `lr`."""
    for group in optimizer.param_groups:
        group["lr"] = lr
