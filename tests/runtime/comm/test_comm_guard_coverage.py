"""What the comm guard covers beyond torch.distributed's package attributes: on a real 2-rank gloo group (see
coverage_scenarios.py), the object collectives and the names the installed megatron-core binds from
torch.distributed at import (skipped without megatron-core); in this process, the rebinding on stand-in modules."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch.distributed as dist

from gdnctl.runtime.comm import guard as comm_guard
from gdnctl.runtime.comm.guard import MEGATRON_BINDINGS, CommGuardPolicy, HostMemoryProbe
from tests.runtime.conftest import torchrun
from tests.runtime.engine_fixture import WORLD_SIZE

NEEDS_MEGATRON = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core")
PHASES = ("imported_before_install", "installed_again")
EVERY_BINDING = {f"{module}.{name}" for module, names in MEGATRON_BINDINGS.items() for name in names}


@pytest.fixture(scope="module")
def coverage_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    out_dir = tmp_path_factory.mktemp("coverage_scenarios")
    completed = torchrun(str(Path(__file__).with_name("coverage_scenarios.py")), str(out_dir), cwd=out_dir)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return out_dir, [json.loads((out_dir / f"results_rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]


def _profile(out_dir: Path, phase: str, rank: int) -> dict[str, tuple[int, int]]:
    document = json.loads((out_dir / phase / f"comm_profile_rank{rank}.json").read_text())
    return {op: (stats["calls"], stats["checks"]) for op, stats in document["ops"].items()}


@NEEDS_MEGATRON
def test_every_binding_of_the_table_is_rebound_while_installed_and_restored_after(coverage_run):
    _, results = coverage_run
    for result in results:
        for phase in PHASES:
            held = result[phase]
            assert set(held["before_install"]) == EVERY_BINDING, phase  # the installed megatron-core has them all
            assert all(value.startswith("torch ") for value in held["before_install"].values()), held
            assert all(value.startswith("guard ") for value in held["while_installed"].values()), held
            assert all(held["restored_exactly"].values()), held
        param_and_grad_buffer = "megatron.core.distributed.param_and_grad_buffer"
        assert {
            name: result[PHASES[0]]["while_installed"][f"{param_and_grad_buffer}.{name}"]
            for name in MEGATRON_BINDINGS[param_and_grad_buffer]
        } == {
            "_coalescing_manager": "guard _coalescing_manager",
            "dist_all_gather_func": "guard all_gather_into_tensor",
            "dist_reduce_scatter_func": "guard reduce_scatter_tensor",
        }


@NEEDS_MEGATRON
def test_megatrons_collectives_give_the_unguarded_result_and_still_coalesce(coverage_run):
    _, results = coverage_run
    for result in results:
        for phase in PHASES:
            assert result[phase]["calls"] == {
                "queued_inside_coalescing_manager": True,
                "reduce_scatter_correct": True,
                "all_gather_correct": True,
                "mappings_correct": True,
            }, phase


@NEEDS_MEGATRON
def test_the_profile_counts_megatrons_reduce_scatter_and_all_gather_once_per_call(coverage_run):
    out_dir, _ = coverage_run
    for rank in range(WORLD_SIZE):
        for phase in PHASES:
            ops = _profile(out_dir, phase, rank)
            # Two buckets in a coalescing manager plus one sequence-parallel call each, every call checked; the
            # coalesced collective torch issues at the manager's exit runs on the real group, so it is not a
            # second count.
            assert {op: ops[op] for op in ("reduce_scatter_tensor", "all_gather_into_tensor")} == {
                "reduce_scatter_tensor": (3, 3),
                "all_gather_into_tensor": (3, 3),
            }, phase
            assert not any(op.endswith("_coalesced") for op in ops), ops


def test_the_object_collectives_are_counted(coverage_run):
    out_dir, results = coverage_run
    for rank, result in enumerate(results):
        assert result["objects"] == {
            "gather_object": True if rank == 0 else None,
            "scatter_object_list": True,
            "send_recv_object_list": True if rank == 1 else None,
        }
        # One count a call: the collectives torch makes inside them (gather, broadcast, scatter, send, recv) are
        # torch's own, not the package attributes the guard replaced.
        point_to_point = "send_object_list" if rank == 0 else "recv_object_list"
        assert _profile(out_dir, "objects", rank) == {
            "gather_object": (1, 1),
            "scatter_object_list": (1, 1),
            point_to_point: (1, 1),
        }


def test_the_table_is_applied_by_identity_and_uninstall_reaches_modules_imported_while_installed(monkeypatch):
    """The rebinding on stand-in modules, in this process (no collective is made): a module imported before
    install, one imported while installed, one never imported, a name a module lacks, and a name Megatron
    reassigned to its own function (as param_and_grad_buffer.py does with reduce_scatter_with_fp32_accumulation)."""

    def megatrons_own(*args, **kwargs):
        return None

    early = types.ModuleType("early")
    early.reduce_scatter, early.own = dist.reduce_scatter_tensor, megatrons_own
    late = types.ModuleType("late")
    monkeypatch.setitem(sys.modules, "early", early)
    monkeypatch.setattr(
        comm_guard,
        "MEGATRON_BINDINGS",
        {"early": ("reduce_scatter", "own", "absent"), "late": ("all_gather",), "never_imported": ("name",)},
    )
    torch_reduce_scatter, torch_all_gather = dist.reduce_scatter_tensor, dist.all_gather_into_tensor
    comm_guard.install(CommGuardPolicy(3.0, frozenset(), profile=False), HostMemoryProbe())
    try:
        exec("from torch.distributed import all_gather_into_tensor as all_gather", late.__dict__)
        monkeypatch.setitem(sys.modules, "late", late)
        # dist.<name> is the guard's wrapper here.
        installed = {
            "early.reduce_scatter": early.reduce_scatter is dist.reduce_scatter_tensor,
            "early.own": early.own is megatrons_own,
            "late.all_gather": late.all_gather is dist.all_gather_into_tensor,
        }
    finally:
        comm_guard.uninstall()
    assert installed == {"early.reduce_scatter": True, "early.own": True, "late.all_gather": True}
    assert early.reduce_scatter is torch_reduce_scatter and early.own is megatrons_own
    assert late.all_gather is torch_all_gather and not hasattr(early, "absent")
