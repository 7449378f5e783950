"""Comm guard scenarios on a real gloo group: `torchrun --nproc_per_node 2 gloo_scenarios.py OUT_DIR`.

Each rank writes what it observed to OUT_DIR/results_rank{R}.json and its comm profile to OUT_DIR/comm_profile;
the tests (test_comm_guard.py, test_comm_report.py) assert on those files. One launch serves every test,
because starting two torch processes is most of the cost.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.runtime.comm import guard as comm_guard
from gdnctl.runtime.comm.guard import CommGuardPolicy, CountingProbe, HostMemoryProbe
from gdnctl.runtime.selftest import changed_entries, gloo_cases, same_result, snapshot_torch_distributed
from gdnctl.schema import comm_ops

PROFILE_SKIP = frozenset({"all_gather_into_tensor"})


class LowMemoryProbe(HostMemoryProbe):
    """Reports no free memory, so every checked call takes the clear path."""

    def free_and_total_bytes(self) -> tuple[int, int]:
        return 0, super().free_and_total_bytes()[1]


def no_profile(free_gb_threshold: float, skip_ops: frozenset[str]) -> CommGuardPolicy:
    return CommGuardPolicy(free_gb_threshold, skip_ops, profile=False)


def equivalence(ranks: list[int]) -> dict:
    """Every gloo collective through the guard (default skip set, nothing skipped, everything skipped) gives
    the unguarded result, and reads the probe exactly when its op is checked."""
    cases = gloo_cases(len(ranks))
    plain = dist.new_group(ranks)
    baseline = [case.run(plain) for case in cases]
    modes = {
        "default": no_profile(3.0, frozenset(comm_ops.DEFAULT_SKIP_OPS)),
        "all_checked": no_profile(3.0, frozenset()),
        "all_skipped": no_profile(3.0, comm_ops.ALL_OPS),
    }
    report = {}
    for mode, policy in modes.items():
        probe = CountingProbe(HostMemoryProbe())
        comm_guard.install(policy, probe)
        try:
            group = dist.new_group(ranks)
            rows = []
            for case, expected in zip(cases, baseline, strict=True):
                before = probe.reads
                same = same_result(case.run(group), expected)
                op = case.op(dist.get_rank())
                rows.append(
                    {
                        "case": case.label,
                        "op": op,
                        "same": same,
                        "reads": probe.reads - before,
                        "checked": op is not None and op not in policy.skip_ops,
                    }
                )
        finally:
            comm_guard.uninstall()
        report[mode] = rows
    return report


def _small_calls(group: dist.ProcessGroup) -> dict:
    size = group.size()
    return {
        "all_reduce": lambda: dist.all_reduce(torch.ones(2), group=group),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.zeros(2 * size), torch.ones(2), group=group
        ),
        "group.allreduce": lambda: group.allreduce([torch.ones(2)]).wait(),
        "group.barrier": lambda: group.barrier().wait(),
        "WORLD.allreduce": lambda: dist.group.WORLD.allreduce([torch.ones(2)]).wait(),
    }


def skip_set_and_clear_path(ranks: list[int]) -> dict:
    """With a low-memory probe: a checked op reads it and collects garbage and empties the cache; a skipped op
    does neither; a zero threshold reads but never clears."""
    collections = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            collections.append(1)

    observed = {}
    gc.disable()  # only the guard's own gc.collect() calls count
    gc.callbacks.append(on_gc)
    try:
        for threshold in (3.0, 0.0):
            probe = CountingProbe(LowMemoryProbe())
            comm_guard.install(no_profile(threshold, frozenset({"all_gather_into_tensor", "barrier"})), probe)
            try:
                for label, call in _small_calls(dist.new_group(ranks)).items():
                    reads, releases, gcs = probe.reads, probe.releases, len(collections)
                    call()
                    observed[f"{label}@{threshold:g}"] = {
                        "reads": probe.reads - reads,
                        "releases": probe.releases - releases,
                        "gc_collects": len(collections) - gcs,
                    }
            finally:
                comm_guard.uninstall()
    finally:
        gc.callbacks.remove(on_gc)
        gc.enable()
    return observed


def exception_notes(ranks: list[int]) -> dict:
    """Errors raised by the wrapped call come back unchanged in type, with the memory state as a note."""
    notes = {}
    comm_guard.install(no_profile(3.0, frozenset({"all_gather_into_tensor"})), HostMemoryProbe())
    try:
        group = dist.new_group(ranks)
        for label, call in {
            "all_reduce": lambda: dist.all_reduce("not a tensor", group=group),
            "all_gather_into_tensor": lambda: dist.all_gather_into_tensor("out", "in", group=group),
            "group.allreduce": lambda: group.allreduce("not a list of tensors"),
        }.items():
            try:
                call()
            except Exception as error:  # noqa: BLE001 - the type is what the test looks at
                notes[label] = {"type": type(error).__name__, "notes": getattr(error, "__notes__", [])}
            else:
                notes[label] = {"type": None, "notes": []}
    finally:
        comm_guard.uninstall()
    return notes


def policy_swap(ranks: list[int]) -> dict:
    """set_policy changes what is checked for groups made before the swap, and keeps the probe."""
    probe = CountingProbe(LowMemoryProbe())
    comm_guard.install(no_profile(3.0, frozenset({"all_gather_into_tensor"})), probe)
    observed = {}
    try:
        calls = _small_calls(dist.new_group(ranks))
        for mode, policy in {
            "installed": None,
            "all_checked": no_profile(3.0, frozenset()),
            "all_skipped": no_profile(3.0, comm_ops.ALL_OPS),
            "zero_threshold": no_profile(0.0, frozenset()),
        }.items():
            if policy is not None:
                comm_guard.set_policy(policy)
            for label in ("all_reduce", "all_gather_into_tensor", "group.allreduce"):
                reads, releases = probe.reads, probe.releases
                calls[label]()
                observed[f"{label}@{mode}"] = {"reads": probe.reads - reads, "releases": probe.releases - releases}
        try:
            comm_guard.set_policy(CommGuardPolicy(3.0, frozenset(), profile=True, profile_dir=Path("unused")))
            observed["profiling_swap_error"] = None
        except RuntimeError as error:
            observed["profiling_swap_error"] = str(error)
    finally:
        comm_guard.uninstall()
    try:
        comm_guard.set_policy(no_profile(3.0, frozenset()))
        observed["uninstalled_swap_error"] = None
    except RuntimeError as error:
        observed["uninstalled_swap_error"] = str(error)
    return observed


def identity_and_lifecycle() -> dict:
    before = snapshot_torch_distributed()
    original_all_reduce, original_get_rank, original_new_group = dist.all_reduce, dist.get_rank, dist.new_group
    comm_guard.uninstall()  # not installed: a no-op
    comm_guard.install(no_profile(3.0, frozenset()), HostMemoryProbe())
    replaced = changed_entries(before)
    try:
        comm_guard.install(no_profile(3.0, frozenset()), HostMemoryProbe())
        second_install = None
    except RuntimeError as error:
        second_install = str(error)
    installed = comm_guard.is_installed()
    comm_guard.uninstall()
    return {
        "replaced_while_installed": replaced,
        "changed_after_uninstall": changed_entries(before),
        "identity": [
            dist.all_reduce is original_all_reduce,
            dist.get_rank is original_get_rank,
            dist.new_group is original_new_group,
        ],
        "second_install_error": second_install,
        "installed_then": installed,
        "installed_now": comm_guard.is_installed(),
        "default_probe": comm_guard.default_memory_probe().name,
    }


def profile(ranks: list[int], out_dir: Path) -> dict:
    """Known call counts, an explicit mid-run write, and the final write at uninstall."""
    policy = CommGuardPolicy(3.0, PROFILE_SKIP, profile=True, profile_dir=out_dir / "comm_profile")
    comm_guard.install(policy, HostMemoryProbe())
    try:
        group = dist.new_group(ranks)
        for _ in range(3):
            dist.all_reduce(torch.ones(1024), group=group)
            dist.all_gather_into_tensor(torch.zeros(2 * len(ranks)), torch.ones(2), group=group)
        for _ in range(2):
            group.allreduce([torch.ones(8)]).wait()
        explicit = comm_guard.write_profile(out_dir / "explicit")
        dist.group.WORLD.barrier().wait()
        # A second group's first all_reduce: a first use, not steady state.
        dist.all_reduce(torch.ones(1024), group=dist.new_group(ranks))
    finally:
        comm_guard.uninstall()
    return {"explicit_path": str(explicit)}


def main() -> None:
    out_dir = Path(sys.argv[1])
    dist.init_process_group("gloo")
    ranks = list(range(dist.get_world_size()))
    results = {
        "equivalence": equivalence(ranks),
        "skip_and_clear": skip_set_and_clear_path(ranks),
        "exceptions": exception_notes(ranks),
        "policy_swap": policy_swap(ranks),
        "lifecycle": identity_and_lifecycle(),
        "profile": profile(ranks, out_dir),
    }
    (out_dir / f"results_rank{dist.get_rank()}.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
