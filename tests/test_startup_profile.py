"""benchmarks/startup_profile/: the sampling profiler a launch's rank 0 loads through sitecustomize, run on a small
script that marks two start-up phases and works on a second thread in the second (as a backward on the autograd
engine's thread does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
import threading, time
from gdnctl.runtime.train.startup import StartupClock

def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(1000))

def idle_then_work():
    threading.Event().wait(0.3)  # a known idle wait: left out of the per-phase tables

clock = StartupClock()
spin(0.3)
clock.mark("set-up")
waiter = threading.Thread(target=idle_then_work)
worker = threading.Thread(target=spin, args=(0.4,), name="backward")
waiter.start(); worker.start(); worker.join(); waiter.join()
clock.mark("step 1")
"""


COMPILING = """
import torch

def fused_gate(x):
    return torch.sigmoid(x) * x

torch.compile(fused_gate, backend="eager")(torch.ones(8))
"""


def profile(tmp_path: Path, script: str = SCRIPT) -> str:
    env = {
        **os.environ,
        # A window far longer than the scripts: on a loaded host `import torch` alone took 15 s and pushed the
        # compile past a 20 s window. The tables are written at the script's exit, whenever that comes.
        "GDNCTL_STARTUP_PROFILE": f"{tmp_path}:toy:600:5",
        "RANK": "0",
        "PYTHONPATH": os.pathsep.join([str(REPO / "benchmarks" / "startup_profile"), str(REPO)]),
    }
    env.pop("GDNCTL_STARTUP_PROFILE_TAKEN", None)
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    return (tmp_path / "toy.startup-profile.txt").read_text()


def seconds_in(table: str, function: str) -> float:
    return sum(float(line.split()[0]) for line in table.splitlines() if line.endswith(f" {function}"))


def section(text: str, title: str) -> str:
    start = text.index(title)
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_profile_splits_by_phase_and_shows_the_other_threads_work(tmp_path):
    text = profile(tmp_path)
    assert "## other threads: functions, self (s)" in text
    set_up = section(text, "## phase before the trainer's first mark")
    step = section(text, "## phase after 'set-up'")
    main_part, others_part = set_up.split("other threads at work, self (s):")
    assert "spin" in main_part and "spin" not in others_part
    main_part, others_part = step.split("other threads at work, self (s):")
    assert "spin" in others_part  # the worker thread's work, charged to the phase it ran in
    # The main thread only waited for it (a sample taken on the phase's edge may land on the other side of it).
    assert seconds_in(main_part, "spin") < 0.05
    assert not [line for line in others_part.splitlines() if line.endswith(" wait")]  # the waiting thread is not
    seconds = float(step.split(":")[1].split()[0])
    assert 0.3 <= seconds < 5


def test_torch_compiles_time_is_charged_to_the_function_it_compiled(tmp_path):
    text = profile(tmp_path, COMPILING)
    table = section(text, "## torch.compile, by the function it compiled")
    total = float(table.split(":")[1].split()[0])
    rows = table.splitlines()[1:]
    assert total > 0 and rows and rows[0].endswith(" fused_gate")
