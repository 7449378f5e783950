"""What the comm guard covers beyond torch.distributed's package attributes, on a real gloo group:
`torchrun --nproc_per_node 2 coverage_scenarios.py OUT_DIR` (test_comm_guard_coverage.py asserts on what it
writes). Each phase installs the guard with every op checked and profiled, into OUT_DIR/<phase>:
- "objects": the object collectives (gather_object, scatter_object_list, send_object_list, recv_object_list).
Each rank writes OUT_DIR/results_rank{R}.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from gdnctl.runtime.comm import guard as comm_guard
from gdnctl.runtime.comm.guard import CommGuardPolicy, HostMemoryProbe


def _object_calls(group: dist.ProcessGroup) -> dict:
    rank = dist.get_rank()
    gathered = [None] * group.size() if rank == 0 else None
    dist.gather_object({"rank": rank}, gathered, dst=0, group=group)
    scattered = [None]
    dist.scatter_object_list(scattered, [{"to": peer} for peer in range(group.size())] if rank == 0 else None,
                             src=0, group=group)
    sent = [{"from": 0}, "two objects"]
    received = [None, None]
    if rank == 0:
        dist.send_object_list(sent, dst=1, group=group)
    elif rank == 1:
        dist.recv_object_list(received, src=0, group=group)
    return {"gather_object": gathered == [{"rank": peer} for peer in range(group.size())] if rank == 0 else None,
            "scatter_object_list": scattered == [{"to": rank}],
            "send_recv_object_list": received == sent if rank == 1 else None}


def _installed(out_dir: Path, phase: str) -> None:
    comm_guard.install(CommGuardPolicy(3.0, frozenset(), profile=True, profile_dir=out_dir / phase),
                       HostMemoryProbe())


def _objects_phase(out_dir: Path) -> dict:
    _installed(out_dir, "objects")
    try:
        return _object_calls(dist.new_group(list(range(dist.get_world_size()))))
    finally:
        comm_guard.uninstall()


def main() -> None:
    out_dir = Path(sys.argv[1])
    dist.init_process_group("gloo")
    results = {"objects": _objects_phase(out_dir)}
    (out_dir / f"results_rank{dist.get_rank()}.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
