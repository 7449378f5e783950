"""The rl job's step-0 check: before any update, the trainer must score the sampled tokens as the rollout did.

On a fresh run's first step the trainer's log-probs and the rollout's come from the same weights, so they differ
only by numerics; a mean |gap| above rollout.max_step0_logprob_gap means the two are not running the same policy,
and every later step would train on off-policy samples without saying so (prime-rl #2671: a step-0 mismatch KL of
0.03 on Qwen3.5-4B). The gap is the policy's own statistic (`rollout_logprob_abs_diff` of its train_step, reduced
over ranks), so every rank decides the same and the job stops on all of them.
"""

from __future__ import annotations

from gdnctl.errors import GdnctlError


class LogprobGapError(GdnctlError):
    """The trainer and the rollout disagree about the first step's samples."""

    exit_code = 1


def check_step0_gap(gap: float, threshold: float | None) -> None:
    """Raise LogprobGapError when the first step's gap is above the threshold (None: the check is off)."""
    if threshold is None or gap <= threshold:
        return
    raise LogprobGapError(
        f"on the first step the trainer scores the rollout's samples {gap:.4f} nats/token (mean |log p| gap) away "
        f"from the rollout, above rollout.max_step0_logprob_gap {threshold:g}, so the job stopped before saving "
        "anything. Before any update both sides hold the same weights, so the likely causes are weights the rollout "
        "did not get or loaded under other names (the weight sync's HF naming), a different dtype on one side "
        "(bf16 against fp32 weights or logits), or different kernels (the GDN prefill backend, attention); compare "
        "the weight-sync probe gap in the log, and raise rollout.max_step0_logprob_gap (0 turns the check off) only "
        "once the gap is known to be numerical."
    )
