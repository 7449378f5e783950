"""Each side's per-step records, and the steps its figures count.

A loop with CUDA graphs runs eagerly until it captures them, and its first graphed steps are still slower than the
ones after (the replays' first launches; the allocator settling into the graphs' pools). The two loops capture at
different steps: gdnctl after `speed.cuda_graph_warmup_steps` eager steps (1 for the proxy: before step 2;
runtime/train/cuda_graphs.py `before_step`), Megatron-Bridge after `cuda_graph_warmup_steps` steps of its own (3 in
its tuned recipe: before step 4; megatron-bridge 0.6 training/train.py captures when `step - start_iteration ==
cuda_graph_warmup_steps`). A window of the same steps on both sides would count the peer's last eager step and its
first graphed ones against gdnctl's steady steps: in the recorded H200 run (benchmarks/results/), the peer's eager
steps 2-3 took 25-75% longer than its steady median and allocated 49.3-50.5 GiB, where every graphed step allocated
44.09 GiB, as gdnctl's did.

So each side's window starts SETTLE_STEPS steps after the step its own capture comes before, and the medians and the
memory peaks (allocated and reserved) are taken over that window only.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

# Steps left out from the one the capture comes before: the first graphed step, 2-10% over the steady median on the
# peer's side in every recorded arm and up to 7% on gdnctl's, and the one after it, within the steps' own spread.
SETTLE_STEPS = 2


def first_steady_step(graph_warmup_steps: int | None) -> int:
    """The first step a side's figures count. A loop that captures its graphs after W eager steps replays them from
    step W + 1; without graphs (None) the loop's first step stands for the capture, so the window starts at step 3,
    after the step that compiles and the one that still grows the allocator's cache."""
    captured_before = 1 if graph_warmup_steps is None else graph_warmup_steps + 1
    return captured_before + SETTLE_STEPS


@dataclass(frozen=True)
class Step:
    """One optimizer step as either loop recorded it: its time, the tokens it trained (all GPUs), and CUDA's
    allocated and reserved peaks during it (the most loaded rank; reserved is None where the loop did not record
    it)."""

    number: int
    seconds: float
    tokens: int
    allocated_gib: float
    reserved_gib: float | None


def gdnctl_steps(path: Path) -> list[Step]:
    """gdnctl's metrics.jsonl: one line a step (iteration, seconds, real tokens, per-step peaks); lines of other
    records (a held-out evaluation) have no `seconds` and are not steps."""
    steps = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if "iteration" not in row or "seconds" not in row:
            continue
        steps.append(
            Step(
                number=row["iteration"],
                seconds=row["seconds"],
                tokens=row["tokens"],
                allocated_gib=row["peak_memory_gib"],
                reserved_gib=row.get("peak_reserved_gib"),
            )
        )
    return steps


def peer_steps(summary: dict) -> list[Step]:
    """benchmarks/megatron_bridge_loop.py's summary: its own train-step timer (synchronised before and after each
    step, peaks reset at each step's start), every step training the global batch's full rows."""
    tokens = summary["shape"]["tokens_per_step"]
    return [
        Step(
            number=row["step"],
            seconds=row["seconds"],
            tokens=tokens,
            allocated_gib=row["peak_gib"],
            reserved_gib=row.get("peak_reserved_gib"),
        )
        for row in summary["train_step_timer"]["per_step"]
    ]


class EmptyWindow(ValueError):
    """The log holds no step at or after the window's first: the arm stopped early or ran too few steps."""


@dataclass(frozen=True)
class Window:
    """What one arm's steady steps measured: medians of the step time and of the per-step rate (tokens / seconds,
    the same definition on both sides), and the largest allocated and reserved peaks."""

    first_step: int
    last_step: int
    steps: int
    step_s: float
    tokens_per_s: float
    allocated_peak_gib: float
    reserved_peak_gib: float | None


def steady_window(steps: list[Step], first_step: int) -> Window:
    counted = [step for step in steps if step.number >= first_step]
    if not counted:
        last = max((step.number for step in steps), default=0)
        raise EmptyWindow(f"the log ends at step {last}, before the steady window's first step {first_step}")
    reserved = [step.reserved_gib for step in counted]
    return Window(
        first_step=first_step,
        last_step=counted[-1].number,
        steps=len(counted),
        step_s=statistics.median(step.seconds for step in counted),
        tokens_per_s=statistics.median(step.tokens / step.seconds for step in counted),
        allocated_peak_gib=max(step.allocated_gib for step in counted),
        reserved_peak_gib=None if None in reserved else max(r for r in reserved if r is not None),
    )
