"""What the comm guard covers beyond torch.distributed's package attributes, on a real gloo group:
`torchrun --nproc_per_node 2 coverage_scenarios.py OUT_DIR` (test_comm_guard_coverage.py asserts on what it
writes). Each phase installs the guard with every op checked and profiled, into OUT_DIR/<phase>:
- "objects": the object collectives (gather_object, scatter_object_list, send_object_list, recv_object_list);
- with megatron-core installed, "imported_before_install": megatron-core is imported, holding torch's functions,
  then the guard is installed (the trainer's order), and "installed_again": a second install after the first
  uninstall. Both call Megatron's bound names as a training step does (distributed/param_and_grad_buffer.py's
  coalesced gradient reduce-scatter and parameter all-gather, tensor_parallel/mappings.py's sequence-parallel
  reduce-scatter and gather).
Each rank writes OUT_DIR/results_rank{R}.json.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.runtime.comm import guard as comm_guard
from gdnctl.runtime.comm.guard import MEGATRON_BINDINGS, CommGuardPolicy, HostMemoryProbe

BUCKETS = 2  # gradient buckets in one coalesced reduce-scatter, as a bucket group holds


def _bound(modules: dict[str, object]) -> dict[str, object]:
    """Every MEGATRON_BINDINGS name the imported modules have, as "module.name" -> the object it holds."""
    return {
        f"{module_name}.{name}": getattr(module, name)
        for module_name, module in modules.items()
        for name in MEGATRON_BINDINGS[module_name]
        if hasattr(module, name)
    }


def _describe(
    bound: dict[str, object], torch_namespace: dict[str, object], guard_namespace: dict[str, object]
) -> dict[str, str]:
    """ "torch <name>" or "guard <name>": which torch.distributed function, or the guard's wrapper of which, each
    bound name holds (the namespaces are `vars(torch.distributed)` without and with the guard installed)."""
    names = {id(value): f"torch {name}" for name, value in torch_namespace.items() if callable(value)}
    names.update(
        {
            id(value): f"guard {name}"
            for name, value in guard_namespace.items()
            if callable(value) and value is not torch_namespace.get(name)
        }
    )
    return {key: names.get(id(value), repr(value)) for key, value in bound.items()}


def _megatron_calls(group: dist.ProcessGroup) -> dict:
    """Megatron's bound names called as megatron-core calls them; results against what the ranks computed."""
    buffer = importlib.import_module("megatron.core.distributed.param_and_grad_buffer")
    mappings = importlib.import_module("megatron.core.tensor_parallel.mappings")
    rank, size = group.rank(), group.size()
    shard = 2

    def contribution(of_rank: int, bucket: int) -> torch.Tensor:
        return torch.arange(shard * size, dtype=torch.float32) + 100 * of_rank + 10 * bucket

    # start_grad_sync: one reduce-scatter per bucket inside an async coalescing manager on the group.
    grads = [contribution(rank, bucket) for bucket in range(BUCKETS)]
    shards = [torch.zeros(shard) for _ in range(BUCKETS)]
    with buffer._coalescing_manager(group, async_ops=True) as manager:
        for bucket in range(BUCKETS):
            buffer.dist_reduce_scatter_func(
                shards[bucket], grads[bucket], op=dist.ReduceOp.SUM, group=group, async_op=True
            )
        # Inside the manager a reduce-scatter is only queued; torch issues the coalesced call at the exit.
        queued = all(not shard_.any() for shard_ in shards)
    manager.wait()
    expected_shards = [
        sum(contribution(other, bucket) for other in range(size))[rank * shard : (rank + 1) * shard]
        for bucket in range(BUCKETS)
    ]
    # start_param_sync: the parameter all-gather, synchronous, in its own coalescing manager.
    params = [torch.zeros(shard * size) for _ in range(BUCKETS)]
    with buffer._coalescing_manager(group, async_ops=False):
        for bucket in range(BUCKETS):
            buffer.dist_all_gather_func(
                params[bucket], torch.full((shard,), float(rank + bucket)), group=group, async_op=False
            )
    expected_params = [
        torch.tensor([float(other + bucket) for other in range(size) for _ in range(shard)])
        for bucket in range(BUCKETS)
    ]
    # Sequence parallel: Megatron's own functions, which allocate their output on torch.cuda.current_device(),
    # here the host.
    torch.cuda.current_device = lambda: torch.device("cpu")
    scattered = mappings._reduce_scatter_along_first_dim(contribution(rank, 0).reshape(shard * size, 1), group)
    gathered = mappings._gather_along_first_dim(torch.full((shard, 1), float(rank)), group)
    return {
        "queued_inside_coalescing_manager": queued,
        "reduce_scatter_correct": all(map(torch.equal, shards, expected_shards)),
        "all_gather_correct": all(map(torch.equal, params, expected_params)),
        "mappings_correct": (
            torch.equal(scattered.flatten(), expected_shards[0]) and torch.equal(gathered.flatten(), expected_params[0])
        ),
    }


def _object_calls(group: dist.ProcessGroup) -> dict:
    rank = dist.get_rank()
    gathered = [None] * group.size() if rank == 0 else None
    dist.gather_object({"rank": rank}, gathered, dst=0, group=group)
    scattered = [None]
    dist.scatter_object_list(
        scattered, [{"to": peer} for peer in range(group.size())] if rank == 0 else None, src=0, group=group
    )
    sent = [{"from": 0}, "two objects"]
    received = [None, None]
    if rank == 0:
        dist.send_object_list(sent, dst=1, group=group)
    elif rank == 1:
        dist.recv_object_list(received, src=0, group=group)
    return {
        "gather_object": gathered == [{"rank": peer} for peer in range(group.size())] if rank == 0 else None,
        "scatter_object_list": scattered == [{"to": rank}],
        "send_recv_object_list": received == sent if rank == 1 else None,
    }


def _installed(out_dir: Path, phase: str) -> None:
    comm_guard.install(CommGuardPolicy(3.0, frozenset(), profile=True, profile_dir=out_dir / phase), HostMemoryProbe())


def _objects_phase(out_dir: Path) -> dict:
    _installed(out_dir, "objects")
    try:
        return _object_calls(dist.new_group(list(range(dist.get_world_size()))))
    finally:
        comm_guard.uninstall()


def _megatron_phase(out_dir: Path, phase: str) -> dict:
    torch_namespace = dict(vars(dist))
    modules = _imported()
    before = _bound(modules)
    _installed(out_dir, phase)
    try:
        guard_namespace = dict(vars(dist))
        installed = _bound(modules)
        # A guarded group, as the ones Megatron's parallel_state makes under the guard.
        result = {"calls": _megatron_calls(dist.new_group(list(range(dist.get_world_size()))))}
    finally:
        comm_guard.uninstall()
    after = _bound(modules)
    return {
        **result,
        "before_install": _describe(before, torch_namespace, guard_namespace),
        "while_installed": _describe(installed, torch_namespace, guard_namespace),
        # Not only the same function: the very object each name held before install.
        "restored_exactly": {key: after[key] is value for key, value in before.items()},
    }


def _imported() -> dict[str, object]:
    return {module_name: importlib.import_module(module_name) for module_name in MEGATRON_BINDINGS}


def main() -> None:
    out_dir = Path(sys.argv[1])
    # torch 2.13 flags all_gather_into_tensor and reduce_scatter_tensor as deprecated; Megatron still binds them.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    dist.init_process_group("gloo")
    results = {"objects": _objects_phase(out_dir)}
    if importlib.util.find_spec("megatron") is not None:
        for phase in ("imported_before_install", "installed_again"):
            results[phase] = _megatron_phase(out_dir, phase)
    (out_dir / f"results_rank{dist.get_rank()}.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
