"""What the comm guard covers beyond torch.distributed's package attributes, on a real 2-rank gloo group (see
coverage_scenarios.py): the object collectives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runtime.conftest import torchrun
from tests.runtime.engine_fixture import WORLD_SIZE


@pytest.fixture(scope="module")
def coverage_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    out_dir = tmp_path_factory.mktemp("coverage_scenarios")
    completed = torchrun(str(Path(__file__).with_name("coverage_scenarios.py")), str(out_dir), cwd=out_dir)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return out_dir, [json.loads((out_dir / f"results_rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]


def _profile(out_dir: Path, phase: str, rank: int) -> dict[str, tuple[int, int]]:
    document = json.loads((out_dir / phase / f"comm_profile_rank{rank}.json").read_text())
    return {op: (stats["calls"], stats["checks"]) for op, stats in document["ops"].items()}


def test_the_object_collectives_are_counted(coverage_run):
    out_dir, results = coverage_run
    for rank, result in enumerate(results):
        assert result["objects"] == {
            "gather_object": True if rank == 0 else None, "scatter_object_list": True,
            "send_recv_object_list": True if rank == 1 else None}
        # One count a call: the collectives torch makes inside them (gather, broadcast, scatter, send, recv) are
        # torch's own, not the package attributes the guard replaced.
        point_to_point = "send_object_list" if rank == 0 else "recv_object_list"
        assert _profile(out_dir, "objects", rank) == {
            "gather_object": (1, 1), "scatter_object_list": (1, 1), point_to_point: (1, 1)}

