"""smoke.json: what a smoke run found (`python -m gdnctl.runtime --smoke`, rank 0 writes it into the run dir) and
what `gdnctl launch --smoke` reads to decide whether the job may start.

The smoke run works in a run dir of its own inside the job's (`smoke/`: its engine config, checkpoints, metrics
and rollout), so the job's checkpoints, metrics and W&B run never see its steps.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

SMOKE_FILE = "smoke.json"
SMOKE_DIR = "smoke"
SMOKE_FORMAT_VERSION = 1

# ok / FAIL: a check passed or failed; warn: measured worse than expected without failing (peak memory above the
# estimate); info: a measurement with nothing to pass (step time); skipped: not run, with the reason.
CheckStatus = Literal["ok", "FAIL", "warn", "info", "skipped"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class SmokeCheck(_Frozen):
    name: str
    status: CheckStatus
    detail: str

    def line(self) -> str:
        if self.status == "info":
            return f"smoke: {self.name} {self.detail}"
        return f"smoke: {self.name} {self.status} ({self.detail})"


class SmokeMeasured(_Frozen):
    step_seconds: float | None  # the last smoke step's wall time
    peak_memory_gib: float | None  # the most loaded rank's peak
    memory_source: str | None  # what peak_memory_gib measures (CUDA allocations, or the process's peak RSS on CPU)
    estimate_peak_memory_gib: float | None  # `gdnctl explain`'s per-GPU total; None where it makes none
    # What peak_memory_gib is compared with: that total less explain's overhead row (CUDA context, NCCL buffers,
    # allocator slack), which CUDA's allocation counter does not see.
    estimate_allocated_gib: float | None


class SmokeReport(_Frozen):
    version: int = SMOKE_FORMAT_VERSION
    job: str
    ranks: int
    green: bool  # no check failed
    checks: tuple[SmokeCheck, ...]
    measured: SmokeMeasured

    @model_validator(mode="after")
    def _green_means_no_failure(self) -> SmokeReport:
        if self.green != all(check.status != "FAIL" for check in self.checks):
            raise ValueError("green must be true exactly when no check has status FAIL")
        return self

    def count(self, status: CheckStatus) -> int:
        return sum(check.status == status for check in self.checks)

    def summary(self) -> str:
        verdict = "green" if self.green else "FAILED"
        words: tuple[tuple[CheckStatus, str], ...] = (
            ("ok", "ok"),
            ("warn", "warned"),
            ("FAIL", "failed"),
            ("skipped", "skipped"),
        )
        counts = ", ".join(f"{self.count(status)} {word}" for status, word in words)
        return f"smoke: {verdict}: {counts} ({self.job} on {self.ranks} rank{'s' if self.ranks != 1 else ''})"

    def lines(self) -> list[str]:
        return [check.line() for check in self.checks] + [self.summary()]
