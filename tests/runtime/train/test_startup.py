"""The start-up line (runtime/train/startup.py): this process's age read from /proc, phases in order, the file."""

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
