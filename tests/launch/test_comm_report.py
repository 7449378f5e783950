"""gdnctl comm-report: merging per-rank profiles into verdicts and a recommended skip set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gdnctl.launch import comm_report
from gdnctl.launch.comm_report import KEEP_CHECKED, MIB, SKIP_SAFE, CommReportError
from tests.runtime.conftest import REPO_ROOT
from tests.runtime.engine_fixture import WORLD_SIZE


def _memory(drop_mib: float = 0.0, allocated_mib: float = 0.0) -> dict:
    return {
        "driver_drop_bytes": int(drop_mib * MIB),
        "allocated_delta_bytes": int(allocated_mib * MIB),
        "reserved_delta_bytes": 0,
    }


def _op(calls: int, checks: int, first_mib: float = 0.0, steady: dict | None = None, groups: int = 1) -> dict:
    return {
        "calls": calls,
        "checks": checks,
        "clears": 0,
        "guard_seconds": 1e-5 * checks,
        "groups": groups,
        "first_use_max": _memory(first_mib),
        "steady_state_max": steady if calls > groups else None,
    }


def _write_profile(directory: Path, rank: int, ops: dict, skip_ops: list[str], world_size: int = 2) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    document = {
        "format": "gdnctl-comm-profile",
        "version": 2,
        "rank": rank,
        "world_size": world_size,
        "probe": "cuda",
        "free_gb_threshold": 3.0,
        "skip_ops": skip_ops,
        "ops": ops,
    }
    (directory / f"comm_profile_rank{rank}.json").write_text(json.dumps(document))


def test_merges_the_files_of_a_real_run(gloo_run):
    out_dir, _ = gloo_run
    report = comm_report.build_report(out_dir)
    assert report.profile_dir == out_dir / "comm_profile"
    assert (report.ranks, report.world_size, report.missing_ranks) == ((0, 1), WORLD_SIZE, ())
    by_op = {verdict.op: verdict for verdict in report.ops}
    assert {op: (v.calls, v.checks) for op, v in by_op.items()} == {
        "all_reduce": (8, 8),
        "all_gather_into_tensor": (6, 0),
        "allreduce": (4, 4),
        "barrier": (2, 2),
    }
    assert by_op["all_reduce"].groups == 2 and by_op["allreduce"].groups == 1
    assert by_op["barrier"].verdict == KEEP_CHECKED and by_op["barrier"].steady_state_max_drop_mib is None
    assert all(v.verdict in (SKIP_SAFE, KEEP_CHECKED) for v in report.ops)
    table = comm_report.format_table(report)
    assert "all_gather_into_tensor" in table and "recommended comm.skip_ops: [" in table
    assert "host memory probe" in table


def test_verdicts_follow_the_steady_state_not_the_first_call(tmp_path):
    profile_dir = tmp_path / "comm_profile"
    for rank in range(2):
        _write_profile(
            profile_dir,
            rank,
            {
                # ~3.7 GiB at first use (NCCL setup, slime PR #1947) and nothing after: skip-safe.
                "all_to_all_single": _op(10, 0, first_mib=3700, steady=_memory(0)),
                "all_reduce": _op(10, 10, steady=_memory(drop_mib=200 if rank == 1 else 0)),
                "all_gather_object": _op(10, 10, steady=_memory(allocated_mib=80)),
                "broadcast": _op(1, 1),
                "_allgather_base": _op(5, 5, steady=_memory(drop_mib=63.9)),
            },
            skip_ops=["all_to_all_single", "barrier"],
        )
    report = comm_report.build_report(tmp_path)
    by_op = {verdict.op: verdict for verdict in report.ops}
    assert by_op["all_to_all_single"].verdict == SKIP_SAFE
    assert by_op["all_to_all_single"].first_use_drop_mib == pytest.approx(3700)
    assert by_op["all_reduce"].verdict == KEEP_CHECKED and "200.0 MiB" in by_op["all_reduce"].reason
    assert by_op["all_gather_object"].verdict == KEEP_CHECKED and "allocator" in by_op["all_gather_object"].reason
    assert by_op["broadcast"].verdict == KEEP_CHECKED and "no steady-state sample" in by_op["broadcast"].reason
    assert by_op["_allgather_base"].verdict == SKIP_SAFE
    # barrier was not called in this run, so it keeps its place in the skip set.
    assert report.recommended_skip_ops == ("_allgather_base", "all_to_all_single", "barrier")
    assert "adds _allgather_base" in comm_report.format_table(report)
    assert comm_report.build_report(tmp_path, threshold_mib=32).recommended_skip_ops == ("all_to_all_single", "barrier")


def test_engine_yaml_profile_dir_wins_and_json_is_plain_data(tmp_path):
    (tmp_path / "engine.yaml").write_text("comm:\n  profile_dir: elsewhere\n")
    _write_profile(tmp_path / "comm_profile", 0, {"all_reduce": _op(2, 2, steady=_memory())}, [], world_size=1)
    _write_profile(tmp_path / "elsewhere", 0, {"barrier": _op(2, 0, steady=_memory())}, ["barrier"], world_size=2)
    report = comm_report.build_report(tmp_path)
    assert report.profile_dir == tmp_path / "elsewhere" and report.missing_ranks == (1,)
    data = json.loads(json.dumps(comm_report.report_as_dict(report)))
    assert data["ops"][0]["op"] == "barrier" and data["recommended_skip_ops"] == ["barrier"]
    assert "missing ranks 1" in comm_report.format_table(report)


def test_a_run_dir_without_profiles_says_how_to_get_them(tmp_path):
    with pytest.raises(CommReportError, match="comm.profile: true"):
        comm_report.build_report(tmp_path)
    with pytest.raises(CommReportError, match="does not exist"):
        comm_report.build_report(tmp_path / "missing")


def test_a_foreign_file_is_refused(tmp_path):
    (tmp_path / "comm_profile_rank0.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(CommReportError, match="not a version 2 gdnctl comm profile"):
        comm_report.build_report(tmp_path)


def test_comm_report_does_not_import_torch():
    code = "import sys, gdnctl.launch.comm_report; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, env={"PYTHONPATH": str(REPO_ROOT)})
