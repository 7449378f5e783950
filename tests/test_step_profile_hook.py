"""benchmarks/step_profile: on PYTHONPATH with GDNCTL_STEP_PROFILE set, any process that imports megatron-core's
schedules gets a forward_backward_no_pipelining that profiles its training calls; without the variable nothing
changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[1] / "benchmarks" / "step_profile"
PROBE = (
    "import megatron.core.pipeline_parallel.schedules as s; "
    "from megatron.core.pipeline_parallel import get_forward_backward_func as g; "
    "print(s.forward_backward_no_pipelining.__name__, g(pp_size=1).__name__)"
)


def _names(tmp_path: Path, **env: str) -> list[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HOOK), os.environ.get("PYTHONPATH", "")]), **env}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PROBE],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


@pytest.mark.slow
def test_the_schedule_megatron_hands_out_is_the_profiled_one(tmp_path):
    names = _names(tmp_path, GDNCTL_STEP_PROFILE=f"{tmp_path}:run:3:2")
    assert names == ["forward_backward", "forward_backward"]


@pytest.mark.slow
def test_without_the_variable_megatron_keeps_its_own_schedule(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "GDNCTL_STEP_PROFILE"}
    environment = {**env, "PYTHONPATH": os.pathsep.join([str(HOOK), env.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PROBE],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["forward_backward_no_pipelining", "forward_backward_no_pipelining"]
