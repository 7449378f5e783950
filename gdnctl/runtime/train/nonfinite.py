"""A step whose loss or gradients are not finite is never applied, and the job stops on it with a sentence.

Every job (sft, pretrain, rl) asks `NonFiniteGuard.after_step` once per optimizer step, after deciding whether the
update went in. The decision itself is each optimizer's own:
- the Megatron trainers give Megatron's optimizer a constant loss scale of 1.0, which turns on its inf/NaN check of
  the main gradients (megatron/core/optimizer/optimizer.py, MixedPrecisionOptimizer.prepare_grads ->
  _unscale_main_grads_and_check_for_nan, all-reduced over the gradient-statistics group; 0.19.2): a non-finite
  gradient returns `update_successful=False` before the optimizer touches its state. Multiplying by 1.0 is exact, so
  finite steps are unchanged. The loss, reduced over every rank, is checked before `step()` is called at all;
- the CPU policy skips `optimizer.step()` when the clipped norm or the reduced loss is not finite.

`train.skip_nonfinite_steps` (default 0) lets that many such steps pass as skipped before the job stops. Nothing is
saved by a stopped job, so `latest` stays on the last good checkpoint.

A diverged update can also stop the next step before it has a loss: with CUDA graphs, the MoE router and dispatch
are replayed on non-finite router scores, and Transformer Engine's grouped linear then refuses token counts that no
longer add up (measured on the 35B-A3B proxy on an H100: lr 1e30, step 2 ended in "split_with_sizes expects
split_sizes to sum exactly to 16384"). Where a step's forward or backward raises and this rank's weights have left
any range a trained model holds (`DIVERGED_WEIGHT`, or not finite), `diverged_step` says so in a sentence instead of
the kernel's traceback.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gdnctl.errors import GdnctlError

# Parameters named in the message (the count is always given).
NAMED_PARAMETERS = 3
# A weight this large has diverged: trained Qwen3.5 weights stay within a few units, and bf16 products of such
# weights overflow within a layer or two.
DIVERGED_WEIGHT = 1e8


class NonFiniteStep(GdnctlError):
    """A step's loss or gradients were not finite more often than train.skip_nonfinite_steps allows."""


@dataclass(frozen=True)
class StepVerdict:
    """What one step left non-finite; `applied` says whether the optimizer took the update."""

    step: int
    applied: bool
    loss_finite: bool
    grad_finite: bool
    # The step's inputs as a sentence fragment ("documents 3, 17 of train.data_path", "prompts at lines ...").
    inputs: str
    # Parameters with a non-finite gradient on this rank, in the model's order, and how many there are in all.
    bad_parameters: Sequence[str] = ()
    parameter_count: int = 0

    @property
    def finite(self) -> bool:
        return self.loss_finite and self.grad_finite

    def what(self) -> str:
        parts = []
        if not self.loss_finite:
            parts.append("the loss")
        if not self.grad_finite:
            parts.append(_gradients(self.bad_parameters, self.parameter_count))
        return " and ".join(parts)


def _gradients(bad: Sequence[str], count: int) -> str:
    if not bad:
        return "the gradient norm"
    # The backward pass runs from the output down, so the last bad parameter in model order is where it began.
    nearest = ", ".join(reversed(bad[-NAMED_PARAMETERS:]))
    return f"the gradients of {len(bad)} of {count} parameters (nearest the output: {nearest})"


def is_finite(*values: float | None) -> bool:
    return all(value is not None and math.isfinite(value) for value in values)


@dataclass
class NonFiniteGuard:
    allowed: int
    skipped: list[int] = field(default_factory=list)

    def after_step(self, verdict: StepVerdict) -> str | None:
        """None for a finite step; for a skipped one the line to log; raises NonFiniteStep past the allowance or
        when a non-finite step was applied anyway (a bug: the optimizer should have refused it)."""
        if verdict.finite:
            return None
        if verdict.applied:
            raise NonFiniteStep(
                f"step {verdict.step} applied an update although {verdict.what()} was not finite; "
                "this is a bug in gdnctl's step check, please report it. Inputs: "
                f"{verdict.inputs}."
            )
        self.skipped.append(verdict.step)
        if len(self.skipped) > self.allowed:
            allowance = (
                "train.skip_nonfinite_steps is 0"
                if not self.allowed
                else f"{len(self.skipped)} steps were not finite ({_steps(self.skipped)}), more than "
                f"train.skip_nonfinite_steps {self.allowed}"
            )
            raise NonFiniteStep(
                f"Stopped at step {verdict.step}: {verdict.what()} was not finite on {verdict.inputs}; the update "
                f"was not applied and nothing was saved, so `latest` is the last good checkpoint ({allowance}). "
                "Look at those inputs, lower train.lr, or set train.skip_nonfinite_steps to let a few such steps "
                "pass."
            )
        return (
            f"step {verdict.step}: {verdict.what()} was not finite on {verdict.inputs}; update skipped "
            f"({len(self.skipped)} of {self.allowed} allowed by train.skip_nonfinite_steps)"
        )


def diverged_step(
    step: int, error: BaseException, largest_weight: float, inputs: str, lr_before: float | None
) -> NonFiniteStep | None:
    """The sentence for a step whose forward or backward raised `error` while this rank's largest weight was
    `largest_weight`; None where the weights look trained (the error is then not a divergence, and stays as it is)."""
    if math.isfinite(largest_weight) and largest_weight < DIVERGED_WEIGHT:
        return None
    first_line = (str(error).strip().splitlines() or [""])[0][:200]
    size = "not finite" if not math.isfinite(largest_weight) else f"as large as {largest_weight:.3g}"
    before = f" at lr {lr_before:.3g}" if lr_before is not None else ""
    return NonFiniteStep(
        f"Stopped at step {step}: the weights the step before left ({size}{before}) diverged, and the step failed "
        f"before its loss was known, on {inputs} ({type(error).__name__}: {first_line}). Nothing of this step was "
        "applied or saved, so `latest` is the last good checkpoint. Lower train.lr (or raise its warm-up) and "
        "resume; speed.cuda_graphs: off shows the non-finite loss itself."
    )


def _steps(steps: list[int]) -> str:
    return ", ".join(str(step) for step in steps)


def describe_documents(documents: Sequence[int], data_path: str | None, limit: int = 8) -> str:
    """'documents 3, 17 and 40 of train.data_path (0-based, in file order)' or the synthetic equivalent."""
    unique = sorted(set(documents))
    shown = ", ".join(str(index) for index in unique[:limit]) + (
        f" and {len(unique) - limit} more" if len(unique) > limit else ""
    )
    where = "of train.data_path (0-based, in file order)" if data_path else "of the synthetic data"
    return f"documents {shown} {where}"
