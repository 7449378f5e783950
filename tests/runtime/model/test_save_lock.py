"""One running job per checkpoint directory (runtime/model/save_lock.py), with real processes."""

from __future__ import annotations

import subprocess
import sys

from gdnctl.runtime.model.save_lock import hold_save_dir

HOLD = (
    "import sys; from pathlib import Path; from gdnctl.runtime.model.save_lock import hold_save_dir; "
    "hold_save_dir(Path(sys.argv[1]), Path('/runs/second')); print('held')"
)


def _second_job(save_dir) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", HOLD, str(save_dir)], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_second_job_is_refused_while_the_first_holds_the_save_dir_and_admitted_after(tmp_path):
    save_dir = tmp_path / "checkpoints"
    first = hold_save_dir(save_dir, tmp_path / "first-run")
    assert hold_save_dir(save_dir, tmp_path / "first-run") is first  # the rl job and its trainer share it
    refused = _second_job(save_dir)
    assert refused.returncode != 0
    assert "is in use by another running job (run dir " in refused.stderr and "first-run" in refused.stderr
    assert "Give this run its own train.save_dir" in refused.stderr
    first.close()  # the first job's process ends (or is killed): the lock goes with it
    admitted = _second_job(save_dir)
    assert admitted.returncode == 0 and admitted.stdout.strip() == "held", admitted.stderr
