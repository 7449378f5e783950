"""The comm guard on real 2-rank gloo groups (see gloo_scenarios.py), plus its policy checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gdnctl.runtime.comm.guard import CommGuardPolicy, CommPolicyError
from gdnctl.runtime.selftest import gloo_cases
from gdnctl.schema import comm_ops
from tests.runtime.engine_fixture import WORLD_SIZE, tiny_engine_config


def test_every_gloo_collective_gives_the_unguarded_result_in_every_mode(gloo_run):
    _, results = gloo_run
    for rank, result in enumerate(results):
        for mode, rows in result["equivalence"].items():
            assert len(rows) == len(gloo_cases(WORLD_SIZE))
            differing = [row["case"] for row in rows if not row["same"]]
            assert differing == [], f"rank {rank}, {mode}"


def test_checked_ops_read_the_probe_once_and_skipped_ops_never(gloo_run):
    _, results = gloo_run
    for result in results:
        for mode, rows in result["equivalence"].items():
            for row in rows:
                assert row["reads"] == int(row["checked"]), (mode, row)
        by_case = {row["case"]: row for row in result["equivalence"]["default"]}
        assert by_case["all_reduce"]["reads"] == 1
        assert by_case["all_gather_into_tensor"]["reads"] == 0  # in slime PR #1947's skip set
        assert by_case["group.allgather_into_tensor_coalesced"]["reads"] == 0  # a method name in that set
        assert by_case["group._allgather_base"]["reads"] == 1
        assert by_case["group.WORLD.allreduce"]["reads"] == 1
        assert all(row["reads"] == 0 for row in result["equivalence"]["all_skipped"])


def test_low_memory_takes_the_clear_path_only_for_checked_ops(gloo_run):
    _, results = gloo_run
    for result in results:
        observed = result["skip_and_clear"]
        for checked in ("all_reduce", "group.allreduce", "WORLD.allreduce"):
            assert observed[f"{checked}@3"] == {"reads": 1, "releases": 1, "gc_collects": 1}
            # A zero threshold still reads free memory but never clears.
            assert observed[f"{checked}@0"] == {"reads": 1, "releases": 0, "gc_collects": 0}
        for skipped in ("all_gather_into_tensor", "group.barrier"):
            for threshold in ("3", "0"):
                assert observed[f"{skipped}@{threshold}"] == {"reads": 0, "releases": 0, "gc_collects": 0}


def test_set_policy_changes_what_existing_groups_check(gloo_run):
    _, results = gloo_run
    for result in results:
        observed = result["policy_swap"]
        # As installed: all_gather_into_tensor skipped, the others checked and (low memory) cleared.
        assert observed["all_reduce@installed"] == {"reads": 1, "releases": 1}
        assert observed["all_gather_into_tensor@installed"] == {"reads": 0, "releases": 0}
        # The group was made before each swap and follows the new policy.
        for label in ("all_reduce", "all_gather_into_tensor", "group.allreduce"):
            assert observed[f"{label}@all_checked"] == {"reads": 1, "releases": 1}
            assert observed[f"{label}@all_skipped"] == {"reads": 0, "releases": 0}
            assert observed[f"{label}@zero_threshold"] == {"reads": 1, "releases": 0}
        assert "profil" in observed["profiling_swap_error"]
        assert "not installed" in observed["uninstalled_swap_error"]


def test_errors_keep_their_type_and_carry_the_memory_state(gloo_run):
    _, results = gloo_run
    for rank, result in enumerate(results):
        for label, error in result["exceptions"].items():
            assert error["type"] in {"TypeError", "ValueError"}, label
            assert len(error["notes"]) == 1, label
            note = error["notes"][0]
            assert note.startswith(f"gdnctl comm guard: {label.removeprefix('group.')} failed on rank {rank}; ")
            assert "host free memory" in note and "GiB" in note and "torch allocator" in note


def test_uninstall_restores_every_replaced_object(gloo_run):
    _, results = gloo_run
    for result in results:
        lifecycle = result["lifecycle"]
        replaced = set(lifecycle["replaced_while_installed"])
        assert {f"dist.{name}" for name in comm_ops.DIST_FUNCTIONS} <= replaced
        assert {f"dist.{name}" for name in comm_ops.QUERY_FUNCTIONS} <= replaced
        assert {"dist.new_group", "dist.group", "P2POp.__new__", "P2POp.__init__"} <= replaced
        assert lifecycle["changed_after_uninstall"] == []
        assert lifecycle["identity"] == [True, True, True]
        assert "already installed" in lifecycle["second_install_error"]
        assert (lifecycle["installed_then"], lifecycle["installed_now"]) == (True, False)
        assert lifecycle["default_probe"] == "host"


def test_profile_counts_calls_checks_and_memory_per_rank(gloo_run):
    out_dir, results = gloo_run
    for rank in range(WORLD_SIZE):
        document = json.loads((out_dir / "comm_profile" / f"comm_profile_rank{rank}.json").read_text())
        assert (document["format"], document["rank"], document["world_size"]) == (
            "gdnctl-comm-profile",
            rank,
            WORLD_SIZE,
        )
        assert (document["probe"], document["skip_ops"]) == ("host", ["all_gather_into_tensor"])
        ops = document["ops"]
        assert set(ops) == {"all_reduce", "all_gather_into_tensor", "allreduce", "barrier"}
        counts = {op: (stats["calls"], stats["checks"], stats["clears"]) for op, stats in ops.items()}
        assert counts == {
            "all_reduce": (4, 4, 0),
            "all_gather_into_tensor": (3, 0, 0),
            "allreduce": (2, 2, 0),
            "barrier": (1, 1, 0),
        }
        # all_reduce ran on two groups (three calls on one, one on another); the methods on their own group.
        assert {op: stats["groups"] for op, stats in ops.items()} == {
            "all_reduce": 2,
            "all_gather_into_tensor": 1,
            "allreduce": 1,
            "barrier": 1,
        }
        memory_keys = {"driver_drop_bytes", "allocated_delta_bytes", "reserved_delta_bytes"}
        for op, stats in ops.items():
            assert set(stats["first_use_max"]) == memory_keys
            assert stats["first_use_max"]["allocated_delta_bytes"] == 0  # no caching allocator on CPU
            assert stats["guard_seconds"] >= 0
            assert (stats["steady_state_max"] is None) == (stats["calls"] == stats["groups"]), op
        assert ops["all_gather_into_tensor"]["guard_seconds"] == 0  # skipped: no time in the check
        # The explicit write happened before the WORLD barrier.
        explicit = json.loads(Path(results[rank]["profile"]["explicit_path"]).read_text())
        assert "barrier" not in explicit["ops"] and explicit["ops"]["all_reduce"]["calls"] == 3


def test_policy_from_engine_resolves_the_profile_dir_against_the_run_dir(tmp_path):
    policy = CommGuardPolicy.from_engine(tiny_engine_config().comm, base_dir=tmp_path)
    assert policy.profile_dir == tmp_path / "comm_profile"
    assert policy.skip_ops == frozenset(comm_ops.DEFAULT_SKIP_OPS)
    assert (policy.free_gb_threshold, policy.profile) == (3.0, True)


def test_policy_names_unknown_ops_and_suggests_the_close_one():
    with pytest.raises(CommPolicyError) as raised:
        CommGuardPolicy(3.0, frozenset({"all_reduse", "get_rank"}), profile=False)
    message = str(raised.value)
    assert isinstance(raised.value, ValueError)
    assert "unknown ops all_reduse, get_rank" in message and "did you mean all_reduce" in message
    assert "gdnctl rules COM001" in message


@pytest.mark.parametrize("threshold", [-1.0, math.nan])
def test_policy_rejects_a_threshold_below_zero(threshold):
    with pytest.raises(CommPolicyError, match="free_gb_threshold"):
        CommGuardPolicy(threshold, frozenset(), profile=False)


def test_profiling_needs_a_directory():
    with pytest.raises(CommPolicyError, match="names no profile directory"):
        CommGuardPolicy(3.0, frozenset(), profile=True)


class _CapturingLowMemoryProbe:
    """A stream recording a CUDA graph, with no memory free: the guard would otherwise take its clear path."""

    name = "capturing"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def free_and_total_bytes(self):
        self.calls.append("free_and_total_bytes")
        return 0, 1

    def allocator_bytes(self):
        self.calls.append("allocator_bytes")
        return 0, 0

    def synchronize(self):
        self.calls.append("synchronize")

    def empty_cache(self):
        self.calls.append("empty_cache")

    def capturing(self):
        return True


@pytest.mark.parametrize("profile", [False, True])
def test_a_collective_recorded_into_a_cuda_graph_is_passed_through_unchecked(tmp_path, profile):
    from gdnctl.runtime.comm.guard import _Guard

    policy = CommGuardPolicy(3.0, frozenset(), profile=profile, profile_dir=tmp_path if profile else None)
    probe = _CapturingLowMemoryProbe()
    guard = _Guard(policy, probe)
    assert guard.call("all_reduce", lambda x, scale=1: x * scale, (2,), {"scale": 3}) == 6
    assert probe.calls == []  # no memory read, no synchronize or empty_cache inside the capture
