"""The start-up line (runtime/train/startup.py): this process's age read from /proc, phases in order, the file,
and what torch.compile took of it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

from gdnctl.runtime.train.startup import STARTUP_FILE, StartupClock, process_age_seconds


def test_process_age_is_the_time_since_this_process_started():
    """A child that sleeps 0.5 s before reading its age reports at least that, and not minutes."""
    code = (
        "import time; time.sleep(0.5); from gdnctl.runtime.train.startup import process_age_seconds; "
        "print(process_age_seconds())"
    )
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.5 <= age < 30
    assert process_age_seconds() > 0


def test_phases_are_reported_in_order_and_written_on_request(tmp_path):
    clock = StartupClock()
    time.sleep(0.05)
    clock.mark("set-up")
    clock.mark("step 1")
    line = clock.report(tmp_path, write=True)
    assert list(clock.phases) == ["process start to trainer", "set-up", "step 1"]
    assert clock.phases["set-up"] >= 0.05
    assert re.fullmatch(
        r"start-up: process start to trainer [\d.]+ s, set-up [\d.]+ s, step 1 [\d.]+ s; [\d.]+ s "
        r"from this rank's start to the end of step 1",
        line,
    )
    written = json.loads((tmp_path / STARTUP_FILE).read_text())
    assert written["phases_s"] == clock.phases
    assert written["total_s"] == round(sum(clock.phases.values()), 2)
    clock.report(tmp_path / "elsewhere", write=False)  # other ranks write nothing
    assert not (tmp_path / "elsewhere").exists()


def test_the_cuda_graph_capture_joins_the_file_after_step_1(tmp_path):
    clock = StartupClock()
    clock.mark("step 1")
    clock.report(tmp_path, write=True)
    assert "cuda_graph_capture_s" not in json.loads((tmp_path / STARTUP_FILE).read_text())
    line = clock.graphs_captured(1.234, tmp_path, write=True)
    written = json.loads((tmp_path / STARTUP_FILE).read_text())
    assert written["phases_s"] == clock.phases  # the phases to the end of step 1 are as they were
    assert written["cuda_graph_capture_s"] == 1.23
    assert written["total_with_capture_s"] == round(written["total_s"] + 1.23, 2)
    assert line.startswith("start-up: CUDA graphs captured in 1.2 s before the first graphed step; ")


def test_what_torch_compile_compiled_before_step_1_joins_the_line_and_the_file(tmp_path):
    import torch

    clock = StartupClock()

    @torch.compile(backend="eager")  # Dynamo's tracing alone: what a warm inductor cache leaves of a compile
    def gate(x):
        return torch.sigmoid(x) * x

    gate(torch.ones(4))
    clock.mark("step 1")
    line = clock.report(tmp_path, write=True)
    seconds, graphs = clock.compiled
    assert graphs == 1 and seconds > 0
    assert line.endswith(f" (torch.compile {seconds:.1f} s of it, 1 graph)")
    written = json.loads((tmp_path / STARTUP_FILE).read_text())
    assert written["torch_compile_s"] == seconds and written["torch_compile_graphs"] == 1


def test_nothing_compiled_since_the_clock_started_says_nothing_of_torch_compile(tmp_path):
    clock = StartupClock()
    clock.mark("step 1")
    assert "torch.compile" not in clock.report(tmp_path, write=True)
    assert "torch_compile_s" not in json.loads((tmp_path / STARTUP_FILE).read_text())
