"""The smoke run's verdicts, and measured memory against `gdnctl explain`'s estimate: functions of numbers (no
torch), shared by the smoke run (runtime/smoke, above the jobs) and the first-minute check of every job."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gdnctl.errors import GdnctlError
from gdnctl.schema import EngineEstimate, SmokeCheck, SmokeMeasured, SmokeReport

# Optimizer steps of a smoke run, and the step after which every job checks its memory. Adam's state materialises
# in the first step, so the second is the first to run with it in memory: a MoE job that fits at step 1 can run
# out of memory at step 2.
SMOKE_STEPS = 2

# explain's memory model is coarse by design (plan/memory.py: "fits / tight / cannot fit", not the last GiB). A
# peak more than this far above it means the model misses something the job allocates, and validate's fit check
# (MEM001) was optimistic for this preset ...
MEMORY_MARGIN = 0.10
# ... once the excess is also more than this: below it the difference is small fixed buffers and one-off
# allocations the model does not count (the tiny sft preset on an H100: 0.30 GiB allocated against an estimate of
# 0.21, 0.45 in a step 1 that compiled with cold caches), which cannot decide whether a job fits a GPU.
MEMORY_MARGIN_GIB = 0.5

# The checks, by the names the report gives them.
START = "job start"
WEIGHT_SYNC = "weight sync"
STEP0_GAP = "step-0 log-prob gap"
OPTIMIZER_STEPS = "optimizer steps"
CHECKPOINT = "checkpoint save+load"
KERNEL_WARM_UP = "gdn kernel warm-up"
STEP_TIME = "step time"
PEAK_MEMORY = "peak memory"


# --- memory against the estimate --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExplainedMemory:
    """explain's per-GPU estimate as the runtime compares it with CUDA's allocation counter."""

    total_gib: float
    overhead_gib: float  # explain's flat row for the CUDA context, NCCL buffers and allocator slack

    @property
    def allocated_gib(self) -> float:
        """The part of the total in tensors PyTorch allocates: what torch.cuda.max_memory_allocated measures."""
        return self.total_gib - self.overhead_gib

    @classmethod
    def of(cls, estimate: EngineEstimate) -> ExplainedMemory | None:
        if estimate.peak_memory_gib is None:
            return None
        return cls(estimate.peak_memory_gib, estimate.overhead_gib or 0.0)


def over_estimate(measured_gib: float, estimate: ExplainedMemory | None) -> bool:
    if estimate is None:
        return False
    excess = measured_gib - estimate.allocated_gib
    return excess > MEMORY_MARGIN * estimate.allocated_gib and excess > MEMORY_MARGIN_GIB


def memory_comparison(measured_gib: float, source: str, estimate: ExplainedMemory | None) -> str:
    if estimate is None:
        return f"{measured_gib:.2f} GiB ({source}; explain makes no memory estimate for this job)"
    change = measured_gib / estimate.allocated_gib - 1 if estimate.allocated_gib > 0 else math.inf
    return (
        f"{measured_gib:.2f} GiB ({source}) vs explain's {estimate.allocated_gib:.2f} GiB for the same "
        f"({change:+.0%}; its {estimate.total_gib:.2f} GiB per GPU less {estimate.overhead_gib:g} GiB for the "
        "CUDA context, NCCL buffers and allocator slack)"
    )


def first_minute_line(measured_gib: float, source: str, estimate: ExplainedMemory | None, steps: int) -> str:
    comparison = memory_comparison(measured_gib, source, estimate)
    return f"first minute: peak memory after {steps} optimizer steps {comparison}"


def memory_warning(measured_gib: float, estimate: ExplainedMemory, steps: int, held: str = "allocated") -> str:
    """The sentence for a peak past the estimate's margin: what it means and what to change. held: how the memory
    was measured ("allocated", or "reserved" where CUDA graphs keep activations in their own pools)."""
    excess = measured_gib - estimate.allocated_gib
    return (
        f"after {steps} optimizer steps the most loaded rank had {measured_gib:.2f} GiB {held}, "
        f"{excess:.2f} GiB ({excess / estimate.allocated_gib:.0%}) more than explain's estimate of "
        f"{estimate.allocated_gib:.2f} GiB for it: the estimate misses memory this job allocates, so validate's "
        "fit check (MEM001) was optimistic; if the GPU is close to full, lower train.micro_batch_size, set "
        "train.recompute or train.optimizer_cpu_offload, or raise parallel.tp or parallel.pp."
    )


def peak_memory(measured_gib: float, source: str, estimate: ExplainedMemory | None) -> SmokeCheck:
    if estimate is None:
        return SmokeCheck(name=PEAK_MEMORY, status="info", detail=memory_comparison(measured_gib, source, None))
    over = over_estimate(measured_gib, estimate)
    margin = f"the margin ({MEMORY_MARGIN:.0%} and {MEMORY_MARGIN_GIB:g} GiB)"
    return SmokeCheck(
        name=PEAK_MEMORY,
        status="warn" if over else "ok",
        detail=f"{memory_comparison(measured_gib, source, estimate)}, {'over' if over else 'within'} {margin}",
    )


# --- the checks ---------------------------------------------------------------------------------------------------


def _finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(value) for value in values)


def started(detail: str) -> SmokeCheck:
    return SmokeCheck(name=START, status="ok", detail=detail)


def optimizer_steps(losses: Sequence[float], grad_norms: Sequence[float], skipped: int = 0) -> SmokeCheck:
    """At least SMOKE_STEPS steps, each with a finite loss and gradient norm, and none skipped by the optimizer."""
    problems = []
    if len(losses) < SMOKE_STEPS:
        problems.append(f"{len(losses)} of {SMOKE_STEPS} steps ran")
    if not _finite(losses) or not _finite(grad_norms):
        problems.append(f"non-finite values: losses {list(losses)}, grad norms {list(grad_norms)}")
    if skipped:
        problems.append(f"the optimizer skipped {skipped} update(s) (non-finite gradients)")
    if problems:
        return SmokeCheck(name=OPTIMIZER_STEPS, status="FAIL", detail="; ".join(problems))
    return SmokeCheck(
        name=OPTIMIZER_STEPS,
        status="ok",
        detail=f"{len(losses)} steps, loss {losses[0]:.4g} -> {losses[-1]:.4g}, grad norm "
        f"{grad_norms[0]:.3g} -> {grad_norms[-1]:.3g}, finite",
    )


def checkpoint_round_trip(
    checkpoint: str, weights: int, optimizer: int, step: int, problems: Sequence[str]
) -> SmokeCheck:
    """A checkpoint saved at the last step and loaded back: every tensor as it was in memory."""
    if problems:
        more = f" and {len(problems) - 4} more" if len(problems) > 4 else ""
        return SmokeCheck(
            name=CHECKPOINT, status="FAIL", detail=f"{checkpoint} loaded back differs: {'; '.join(problems[:4])}{more}"
        )
    return SmokeCheck(
        name=CHECKPOINT,
        status="ok",
        detail=f"{checkpoint}: {weights} weight tensors and {optimizer} optimizer state entries as in "
        f"memory after loading it back, step {step}",
    )


def unchecked_parameters(checked: int, total: int) -> str:
    """What the weight-sync reports (this verdict and the rl job's log) say of the parameters they could not
    checksum: ones the rollout does not show whole (packed into its kernels' own layout, tensor-parallel shards, or
    not shown under the trainer's names), which the probe's log-probs cover."""
    if checked >= total:
        return ""
    return (
        f" (the other {total - checked} are not visible whole in the rollout, e.g. packed by vLLM's kernels or "
        "tensor-parallel shards; the probe covers them)"
    )


def weight_sync(syncs: Sequence[tuple[int, int, float]], tolerance: float) -> SmokeCheck:
    """Each sync's (parameters checked, parameters sent, probe gap): the job has already failed on a mismatch."""
    checked = min(sync[0] for sync in syncs)
    total = max(sync[1] for sync in syncs)
    gap = max(sync[2] for sync in syncs)
    return SmokeCheck(
        name=WEIGHT_SYNC,
        status="ok",
        detail=f"{len(syncs)} sync{'s' if len(syncs) != 1 else ''} checked: {checked} of {total} "
        f"parameters match{unchecked_parameters(checked, total)}, probe gap {gap:.4f} <= "
        f"{tolerance:g} nats/token",
    )


def step0_logprob_gap(gap: float, threshold: float | None) -> SmokeCheck:
    if threshold is None:
        return SmokeCheck(
            name=STEP0_GAP,
            status="info",
            detail=f"{gap:.4f} nats/token (not checked: rollout.max_step0_logprob_gap is off)",
        )
    return SmokeCheck(name=STEP0_GAP, status="ok", detail=f"{gap:.4f} <= {threshold:g} nats/token")


def step_time(seconds: float, step: int, parts: str = "", mfu: float | None = None) -> SmokeCheck:
    extras = "".join(f"; {text}" for text in (parts, f"{mfu:.1%} MFU" if mfu is not None else "") if text)
    return SmokeCheck(
        name=STEP_TIME,
        status="info",
        detail=f"{seconds:.2f} s (step {step}{extras}; explain makes no step-time estimate)",
    )


def kernel_warm_up(backend: str, first_call_s: float, warm_call_s: float) -> SmokeCheck:
    return SmokeCheck(
        name=KERNEL_WARM_UP,
        status="info",
        detail=f"{backend}: first call {first_call_s:.2f} s, warm {warm_call_s * 1e3:.2f} ms",
    )


def error_text(error: BaseException) -> str:
    """A GdnctlError is already a sentence; anything else is named with its first line."""
    if isinstance(error, GdnctlError):
        return str(error)
    first = str(error).strip().splitlines()
    return f"{type(error).__name__}: {first[0]}" if first else type(error).__name__


class Checklist:
    """A job's checks in report order, each decided once it is known, and the measurements. Checks left undecided
    when the smoke stops are reported as skipped, with where it stopped."""

    def __init__(self, names: Sequence[str]) -> None:
        self._decided: dict[str, SmokeCheck | None] = dict.fromkeys(names)
        self.stopped_at: str | None = None
        self.measured = SmokeMeasured(
            step_seconds=None,
            peak_memory_gib=None,
            memory_source=None,
            estimate_peak_memory_gib=None,
            estimate_allocated_gib=None,
        )

    def decide(self, check: SmokeCheck) -> None:
        if check.name not in self._decided:
            raise KeyError(f"'{check.name}' is not one of this smoke's checks ({', '.join(self._decided)})")
        self._decided[check.name] = check

    def fail(self, name: str, error: BaseException) -> None:
        self.decide(SmokeCheck(name=name, status="FAIL", detail=error_text(error)))
        self.stopped_at = name

    def checks(self) -> list[SmokeCheck]:
        reason = (
            f"not reached: the smoke stopped at the {self.stopped_at} check"
            if self.stopped_at
            else "not measured by this job's smoke run"
        )
        return [
            check or SmokeCheck(name=name, status="skipped", detail=reason) for name, check in self._decided.items()
        ]

    def report(self, job: str, ranks: int) -> SmokeReport:
        checks = self.checks()
        return SmokeReport(
            job=job,
            ranks=ranks,
            green=all(check.status != "FAIL" for check in checks),
            checks=tuple(checks),
            measured=self.measured,
        )
