"""One 2-rank gloo launch of gloo_scenarios.py, shared by the comm guard and comm report tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """(output dir, per-rank results) of the scenarios, run once per session."""
    out_dir = tmp_path_factory.mktemp("gloo_scenarios")
    completed = torchrun(str(Path(__file__).with_name("gloo_scenarios.py")), str(out_dir), cwd=out_dir)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    results = [json.loads((out_dir / f"results_rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]
    return out_dir, results
