"""torchrun for the runtime tests (tests/conftest.py gloo_run launches gloo_scenarios.py with it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .engine_fixture import WORLD_SIZE

REPO_ROOT = Path(__file__).resolve().parents[2]


def torchrun(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run `torchrun --standalone --nproc_per_node 2 ...` with the repo importable."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(WORLD_SIZE),
        *args,
    ]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
