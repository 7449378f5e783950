"""Where a rank's time to its first step goes: one line after step 1 and `startup.json` beside metrics.jsonl.

Phases, each measured on rank 0 from the previous mark: the process's start to the trainer's set-up (Python, torch,
the process group), Megatron-Core's imports and its process groups, the model build (megatron-bridge's provider and
Transformer Engine's layers, or the TE-free spec), the weights (loaded, or as initialised), DDP and the optimizer
(and a resume's optimizer state), the GDN kernel's warm-up, the data pipeline and step 1 itself. The process start is
read from Linux's /proc (the time torchrun started this rank); elsewhere that phase is left out. CUDA graphs are
captured after the eager warm-up step(s), before the first graphed step: the file adds that capture once it is done.
Where torch.compile compiled anything in those phases (Megatron-Core's fused functions, in step 1), the line and the
file also say how long it took and how many graphs it made: with warm caches about half of step 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from gdnctl.files import replace_text

STARTUP_FILE = "startup.json"
# The last phase a clock in this process marked as ended: the start-up profiler (benchmarks/startup_profile/) reads
# it from this module to split its samples by phase; nothing in gdnctl reads it.
last_mark: str | None = None


def torch_compile_spent() -> tuple[float, int] | None:
    """Seconds torch.compile has spent compiling in this process and the graphs it has made, from Dynamo's own
    accounting (torch/_dynamo/utils.py: `calculate_time_spent()["total_wall_time"]`, the sum of its compile
    phases, and `counters["stats"]["unique_graphs"]`; torch 2.11); None where this torch keeps neither. Imports
    nothing: a process that never imported Dynamo has compiled nothing."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    if dynamo_utils is None:
        return 0.0, 0
    try:
        seconds = float(dynamo_utils.calculate_time_spent().get("total_wall_time", 0.0))
        graphs = int(dynamo_utils.counters["stats"]["unique_graphs"])
    except (ImportError, AttributeError, KeyError, TypeError, ValueError):
        return None
    return seconds, graphs


def _graphs(count: int) -> str:
    return f"{count} graph" if count == 1 else f"{count} graphs"


def process_age_seconds() -> float | None:
    """Seconds since this process started, from /proc/self/stat's start time (field 22, in clock ticks after boot)
    and /proc/uptime; None where /proc is not Linux's."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(after_name[19])  # field 22; the text after the name starts at field 3
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """Marks phases as they end; `report` after step 1 gives the line and writes the file (rank 0). Where CUDA
    graphs are captured after the eager warm-up step(s), `graphs_captured` adds the capture to the file: it is
    start-up too, paid once before the first graphed step, but after step 1."""

    def __init__(self) -> None:
        age = process_age_seconds()
        self.phases: dict[str, float] = {} if age is None else {"process start to trainer": round(age, 2)}
        self.capture_s: float | None = None
        self.compiled: tuple[float, int] | None = None  # torch.compile's seconds and graphs, up to step 1
        self._compiled_before = torch_compile_spent()
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        global last_mark
        now = time.perf_counter()
        self.phases[phase] = round(now - self._last, 2)
        self._last = now
        last_mark = phase

    def _total(self) -> float:
        """Seconds from this rank's start to the end of step 1: the phases' sum."""
        return sum(self.phases.values())

    def report(self, run_dir: Path, write: bool) -> str:
        total = self._total()
        now, before = torch_compile_spent(), self._compiled_before
        if now is not None and before is not None and now[1] > before[1]:
            self.compiled = (round(now[0] - before[0], 2), now[1] - before[1])
        if write:
            self._write(run_dir)
        compiled = (
            ""
            if self.compiled is None
            else f" (torch.compile {self.compiled[0]:.1f} s of it, {_graphs(self.compiled[1])})"
        )
        return (
            "start-up: "
            + ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.phases.items())
            + f"; {total:.1f} s from this rank's start to the end of step 1{compiled}"
        )

    def graphs_captured(self, seconds: float, run_dir: Path, write: bool) -> str:
        """The CUDA-graph capture's seconds, added to the file (`cuda_graph_capture_s`, and `total_with_capture_s`:
        the phases to the end of step 1 plus the capture); returns the line saying so."""
        self.capture_s = round(seconds, 2)
        total = self._total() + self.capture_s
        if write:
            self._write(run_dir)
        return (
            f"start-up: CUDA graphs captured in {self.capture_s:.1f} s before the first graphed step; "
            f"{total:.1f} s with the phases to the end of step 1"
        )

    def _write(self, run_dir: Path) -> None:
        record: dict = {"phases_s": self.phases, "total_s": round(self._total(), 2)}
        if self.compiled is not None:
            record["torch_compile_s"], record["torch_compile_graphs"] = self.compiled
        if self.capture_s is not None:
            record["cuda_graph_capture_s"] = self.capture_s
            record["total_with_capture_s"] = round(record["total_s"] + self.capture_s, 2)
        replace_text(run_dir / STARTUP_FILE, json.dumps(record) + "\n")
