"""Every job's first-minute memory check: after the second optimizer step of this start, the most loaded rank's
peak memory against `gdnctl explain`'s estimate (the engine config carries it).

The second step is the first to run with the optimizer state in memory (Adam's moments materialise in the first),
which is where a MoE job that fitted at step 1 runs out of memory. One line on rank 0; a warning sentence on
stderr when the peak is past the estimate's margin. The job goes on: a peak above the estimate is news about the
estimate, not a failure of this job.

Where CUDA graphs cover the attention and GDN blocks, their activations live in the graphs' private memory pools,
which CUDA's allocated peak does not count and its reserved peak does: on the 35B-A3B proxy (one H100) the allocated
peak fell from 49.3-50.9 GiB to 44.09 GiB once those graphs were captured, the reserved one stayed at 53.7 GiB
(benchmarks/results/trainer-vs-megatron-bridge-h100-2026-11-26.md). There the check reads the reserved
peak, which the trainer passes (`reads_reserved`).
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

from gdnctl.runtime.checks.verdicts import (
    SMOKE_STEPS,
    ExplainedMemory,
    first_minute_line,
    memory_warning,
    over_estimate,
    peak_memory,
)
from gdnctl.schema import EngineConfig, SmokeCheck, SmokeMeasured

GIB = 2**30


def peak_memory_gib(device: str) -> float:
    """This process's peak: CUDA allocations on GPUs, the resident set on CPU (Linux reports ru_maxrss in KiB)."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def memory_source(device: str, reserved: bool = False) -> str:
    if device != "cuda":
        return "peak RSS of the process"
    return "CUDA max reserved (CUDA graphs hold activations)" if reserved else "CUDA max allocated"


class FirstMinuteWatch:
    """Every rank calls after_step once per optimizer step (the reduction over ranks is collective)."""

    def __init__(self, config: EngineConfig, log: Callable[[str], None]) -> None:
        self.device = config.device
        # The trainer's graphs of attention and GDN blocks keep activations outside the allocated count.
        self.reads_reserved = config.device == "cuda" and "attn" in config.speed.cuda_graph_modules
        self.estimate = ExplainedMemory.of(config.estimate)
        self._log = log
        self.steps = 0
        self._local_peak_gib = 0.0
        self.peak_gib: float | None = None  # the most loaded rank's, once SMOKE_STEPS steps have run

    @property
    def source(self) -> str:
        return f"{memory_source(self.device, self.reads_reserved)}, most loaded rank"

    def after_step(self, step_peak_gib: float | None = None) -> None:
        """step_peak_gib: the step's own peak, from a caller that resets CUDA's peak counter every step (the
        trainer); without it the process's peak so far is read here."""
        self.steps += 1
        measured = step_peak_gib if step_peak_gib is not None else peak_memory_gib(self.device)
        self._local_peak_gib = max(self._local_peak_gib, measured)
        if self.steps != SMOKE_STEPS:
            return
        peak = torch.tensor([self._local_peak_gib], dtype=torch.float64)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        self.peak_gib = float(peak[0])
        self._log(first_minute_line(self.peak_gib, self.source, self.estimate, self.steps))
        if over_estimate(self.peak_gib, self.estimate) and dist.get_rank() == 0:
            print(
                "gdnctl warning: "
                + memory_warning(
                    self.peak_gib, self.estimate, self.steps, "reserved" if self.reads_reserved else "allocated"
                ),
                file=sys.stderr,
                flush=True,
            )

    def verdict(self) -> SmokeCheck:
        """The smoke's peak-memory check (once SMOKE_STEPS steps have run)."""
        return peak_memory(self.peak_gib, self.source, self.estimate)

    def measured(self, step_seconds: float) -> SmokeMeasured:
        return SmokeMeasured(
            step_seconds=step_seconds,
            peak_memory_gib=self.peak_gib,
            memory_source=self.source,
            estimate_peak_memory_gib=self.estimate.total_gib if self.estimate else None,
            estimate_allocated_gib=self.estimate.allocated_gib if self.estimate else None,
        )
