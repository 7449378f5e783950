"""PPO updates over one rollout batch: mini-batches, epochs, and the step's statistics from theirs.

The step's samples split into grpo.mini_batches contiguous mini-batches (each prompt's group stays together when
the counts divide); every epoch (grpo.epochs) takes one optimizer step per mini-batch, in order. Each data-parallel
rank trains its share of every mini-batch, so all ranks take the same number of optimizer steps.

The ratio in the clipped loss is against the proximal policy, the policy's own weights at the start of the update:
its log-probs of every sample ("old") are computed once, before the first update, and every later update compares
with them. From the second update on, the policy has moved, so the ratio leaves 1 and the clip acts. With one update
per step the old log-probs are the current ones, which the policy takes from the update's own forward (detached)
instead of a second forward. On-policy the proximal policy is the one that sampled; off-policy
(rollout.max_staleness) the samples come from older weights, and the importance weight against the engine's
log-probs (grpo.py, always on there) corrects for them: AReaL's decoupled objective.
"""

from __future__ import annotations

from collections.abc import Sequence

from gdnctl.runtime.rl.algorithm import batch as rl_batch
from gdnctl.runtime.rl.algorithm.batch import Sample


def split_mini_batches(samples: Sequence[Sample], count: int) -> list[list[Sample]]:
    """`count` contiguous, equal mini-batches (validate's RLT016 checks that the batch splits evenly)."""
    if count < 1 or len(samples) % count:
        raise ValueError(
            f"{len(samples)} samples cannot be split into {count} equal mini-batches; make "
            "train.global_batch_size a multiple of grpo.mini_batches x the data-parallel size."
        )
    size = len(samples) // count
    return [list(samples[start : start + size]) for start in range(0, len(samples), size)]


def update(policy, samples: Sequence[Sample], config, *, lr: float, pad_id: int, row_multiple: int) -> dict:
    """Every optimizer step of one rollout batch -> the step's stats (the same on every rank).

    loss, grad_norm, kl, clip_fraction, approx_kl and the rollout-correction stats are means over the updates;
    ratio_min / ratio_max the extremes over all of them; tokens the tokens trained on in all updates;
    rollout_logprob_abs_diff the gap between the sampling policy's log-probs (before any update) and the rollout's;
    updates how many optimizer steps were applied. An update that is not applied (non-finite loss or gradients)
    ends the step there, and its verdict is the step's."""
    settings = config.grpo
    minis = []
    for part in split_mini_batches(samples, settings.mini_batches):
        mine = rl_batch.rank_share(part, policy.dp_rank, policy.dp_size)
        minis.append(
            [
                rl_batch.build_batch(micro, pad_id, multiple=row_multiple)
                for micro in rl_batch.micro_batches(mine, config.train.micro_batch_size)
            ]
        )
    reused = settings.mini_batches * settings.epochs > 1
    olds = [policy.logprobs(batches) for batches in minis] if reused else [None] * len(minis)
    runs: list[dict] = []
    for epoch in range(settings.epochs):
        for batches, old in zip(minis, olds, strict=True):
            stats = policy.train_step(batches, settings, lr=lr, old_logprobs=old)
            stats["epoch"] = epoch
            runs.append(stats)
            if not stats["applied"]:
                return _combined(runs)
    return _combined(runs)


_MEANS = ("loss", "grad_norm", "clip_fraction", "approx_kl", "kl", "tis_mean", "tis_capped_fraction")


def _combined(runs: list[dict]) -> dict:
    last = runs[-1]
    out = {name: last[name] for name in ("loss_finite", "grad_finite", "applied", "bad_parameters", "parameter_count")}
    for name in _MEANS:
        if name in last:
            out[name] = sum(run[name] for run in runs) / len(runs)
    out["ratio_min"] = min(run["ratio_min"] for run in runs)
    out["ratio_max"] = max(run["ratio_max"] for run in runs)
    out["tokens"] = sum(run["tokens"] for run in runs)
    first_pass = [run for run in runs if run["epoch"] == 0]
    weight = sum(run["response_tokens"] for run in first_pass)
    out["rollout_logprob_abs_diff"] = sum(
        run["rollout_logprob_abs_diff"] * run["response_tokens"] for run in first_pass
    ) / max(weight, 1)
    out["updates"] = sum(1 for run in runs if run["applied"])
    return out
