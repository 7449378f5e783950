"""Shared fixtures: the local Slurm cluster, golden-file updates."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.slurm_cluster import ensure_local_slurm, local_slurm_running, stop_local_slurm


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true",
                     help="Rewrite tests/golden from the current templates instead of comparing against it.")


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def local_slurm() -> Iterator[dict[str, str]]:
    """A real single-node Slurm cluster (tools/local-slurm.sh); the env to submit with.

    GDNCTL_SLURM_TESTS=0 skips the tests that need it; GDNCTL_KEEP_SLURM=1 leaves a cluster this session
    started running afterwards (one that was already up is always left running).
    """
    if os.environ.get("GDNCTL_SLURM_TESTS") == "0":
        pytest.skip("GDNCTL_SLURM_TESTS=0")
    was_running = local_slurm_running()
    env = ensure_local_slurm()
    yield env
    if not was_running and os.environ.get("GDNCTL_KEEP_SLURM") != "1":
        stop_local_slurm()
