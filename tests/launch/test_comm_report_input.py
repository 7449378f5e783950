"""comm-report on profiles and engine.yaml files it did not write, or that broke on the way: a sentence naming the
file and the field (exit 2), never a crash, a hang, or a verdict computed from NaN."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gdnctl.cli import app
from gdnctl.launch import comm_report
from gdnctl.launch.comm_report import SKIP_SAFE, CommReportError

MEMORY = {"driver_drop_bytes": 0, "allocated_delta_bytes": 0, "reserved_delta_bytes": 0}
OP = {
    "calls": 4,
    "checks": 4,
    "clears": 0,
    "guard_seconds": 4e-5,
    "groups": 1,
    "first_use_max": dict(MEMORY),
    "steady_state_max": dict(MEMORY),
}
PROFILE = {
    "format": "gdnctl-comm-profile",
    "version": 2,
    "rank": 0,
    "world_size": 1,
    "probe": "cuda",
    "free_gb_threshold": 3.0,
    "skip_ops": ["barrier"],
    "ops": {"all_reduce": OP},
}


def _write(directory: Path, text: str | bytes, rank: int = 0) -> Path:
    profile_dir = directory / "comm_profile"
    profile_dir.mkdir(exist_ok=True)
    path = profile_dir / f"comm_profile_rank{rank}.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _changed(path: tuple, value) -> dict:
    document = copy.deepcopy(PROFILE)
    node = document
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return document


def _report(run_dir: Path, *args: str):
    return CliRunner().invoke(app, ["comm-report", str(run_dir), *args])


@pytest.mark.parametrize(
    ("document", "said"),
    [
        (json.dumps([PROFILE]), "is not a version 2 gdnctl comm profile"),
        (json.dumps("gdnctl-comm-profile"), "is not a version 2 gdnctl comm profile"),
        (json.dumps(_changed(("ops",), KeyError)), "(ops: field required)"),
        (json.dumps(_changed(("ops", "all_reduce", "first_use_max"), KeyError)), "(ops.all_reduce.first_use_max:"),
        (
            json.dumps(_changed(("ops", "all_reduce", "calls"), True)),
            "(ops.all_reduce.calls: input should be a valid integer)",
        ),
        (
            json.dumps(_changed(("ops", "all_reduce", "steady_state_max", "driver_drop_bytes"), "0")),
            "(ops.all_reduce.steady_state_max.driver_drop_bytes:",
        ),
        (json.dumps(_changed(("ops", "all_reduce"), [])), "(ops.all_reduce:"),
        (json.dumps(_changed(("skip_ops",), "barrier")), "(skip_ops:"),
        (json.dumps(_changed(("world_size",), 1e9)), "(world_size:"),
        (json.dumps(_changed(("rank",), 1)), "rank 1 is outside its world of 1 ranks"),
        (json.dumps(_changed(("ops", "all_reduce", "guard_seconds"), math.nan)), "(ops.all_reduce.guard_seconds:"),
        (
            json.dumps(_changed(("ops", "all_reduce", "steady_state_max", "driver_drop_bytes"), math.nan)),
            "(ops.all_reduce.steady_state_max.driver_drop_bytes:",
        ),
        (json.dumps(_changed(("free_gb_threshold",), math.inf)), "(free_gb_threshold:"),
        (b'{"format": "gdnctl-comm-profile\xff"}', "is not UTF-8 text"),
        ('{"format": ', "is not valid JSON"),
        ("[" * 100_000, "nests its JSON deeper than a reader can follow"),
    ],
)
def test_a_profile_gdnctl_did_not_write_is_named_with_its_field(tmp_path, document, said):
    path = _write(tmp_path, document)
    result = _report(tmp_path)
    assert result.exit_code == 2, result.output
    assert str(path) in result.stderr and said in result.stderr


def test_a_world_of_a_billion_ranks_is_refused_at_once(tmp_path):
    _write(tmp_path, json.dumps(_changed(("world_size",), 10**9)))
    proc = subprocess.run(
        [sys.executable, "-m", "gdnctl", "comm-report", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "(world_size: input should be less than or equal to 1048576)" in proc.stderr


def test_a_fifo_or_a_device_is_refused_without_reading_it(tmp_path):
    profile_dir = tmp_path / "comm_profile"
    profile_dir.mkdir()
    os.mkfifo(profile_dir / "comm_profile_rank0.json")
    (profile_dir / "comm_profile_rank1.json").symlink_to("/dev/zero")
    proc = subprocess.run(
        [sys.executable, "-m", "gdnctl", "comm-report", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "is a named pipe (FIFO), not a regular file" in proc.stderr


def test_a_file_named_for_another_rank_and_mixed_runs_are_refused(tmp_path):
    _write(tmp_path, json.dumps(_changed(("world_size",), 2)), rank=1)
    assert "holds the profile of rank 0, not of the rank its name says" in _report(tmp_path).stderr
    _write(tmp_path, json.dumps(_changed(("world_size",), 4)), rank=0)
    (tmp_path / "comm_profile" / "comm_profile_rank1.json").write_text(
        json.dumps({**_changed(("world_size",), 2), "rank": 1})
    )
    result = _report(tmp_path)
    assert result.exit_code == 2 and "come from runs of 2 and 4 ranks" in result.stderr


@pytest.mark.parametrize("threshold", ["nan", "inf", "-1"])
def test_a_threshold_that_is_not_a_number_of_mib_is_refused(tmp_path, threshold):
    _write(tmp_path, json.dumps(PROFILE))
    result = _report(tmp_path, "--threshold-mib", threshold)
    assert result.exit_code == 2 and "--threshold-mib is" in result.stderr
    with pytest.raises(CommReportError):
        comm_report.merge_profiles(comm_report.load_profiles(tmp_path / "comm_profile"), tmp_path, float(threshold))
    assert comm_report.build_report(tmp_path).ops[0].verdict == SKIP_SAFE


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("comm: [unclosed\n", "is not valid YAML"),
        ("comm: {profile_dir: 3}\n", "comm.profile_dir is 3"),
        (b"comm: \xff\n", "is not UTF-8 text"),
    ],
)
def test_an_engine_yaml_that_does_not_parse_is_named(tmp_path, text, said):
    _write(tmp_path, json.dumps(PROFILE))
    (tmp_path / "engine.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    result = _report(tmp_path)
    assert result.exit_code == 2 and str(tmp_path / "engine.yaml") in result.stderr and said in result.stderr
