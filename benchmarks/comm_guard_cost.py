"""Cost of the communication memory guard on real NCCL collectives (2+ GPUs, one process per GPU).

    torchrun --standalone --nproc-per-node 2 benchmarks/comm_guard_cost.py --out guard.json

Measures, per call, in one run:
- `torch.cuda.mem_get_info()` alone (what a checked op adds);
- a 256 KiB `all_gather_into_tensor` raw, through the guard with it skipped (default policy), and through the
  guard with it checked (empty skip set): target skipped <= raw + 2 us, checked ~ raw + one mem_get_info;
- throughput of a comm-heavy loop of small collectives (all_gather_into_tensor, reduce_scatter_tensor,
  all_to_all_single: the hot path of distributed-optimizer and MoE/CP steps) with no guard, the default
  policy and every op checked: target default >= 95% of no-guard. A second loop that adds all_reduce and
  broadcast (which the default policy keeps checked) is reported as well.
The modes are measured in interleaved rounds (the order rotates each round) and each figure is the median
over rounds, so clock ramps and drift hit every mode alike. The guard's own host cost is also timed around
a no-op callable, which isolates it from NCCL's launch time. Every rank runs the same calls in the same order.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import date

import torch
import torch.distributed as dist

from gdnctl.runtime.comm import guard as comm_guard
from gdnctl.schema import comm_ops

CALLS = 1000
ROUNDS = 9


def _per_call_us(fn, calls: int = CALLS) -> float:
    for _ in range(20):
        fn()
    dist.barrier()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def _host_overhead_us(skip_ops, calls: int = 200_000) -> float:
    """The guard's wrapper around a no-op: its host cost alone, without any collective."""

    def noop(*args, **kwargs):
        return None

    wrapped = comm_guard._guarded_function("all_gather_into_tensor", noop)
    comm_guard.install(_policy(skip_ops))
    try:
        start = time.perf_counter()
        for _ in range(calls):
            wrapped(1, 2)
        guarded = time.perf_counter() - start
    finally:
        comm_guard.uninstall()
    start = time.perf_counter()
    for _ in range(calls):
        noop(1, 2)
    return (guarded - (time.perf_counter() - start)) / calls * 1e6


def _policy(skip_ops) -> comm_guard.CommGuardPolicy:
    return comm_guard.CommGuardPolicy(free_gb_threshold=3.0, skip_ops=frozenset(skip_ops), profile=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world = dist.get_world_size()
    device = torch.device("cuda", local_rank)

    shard = torch.randn(128 * 1024, device=device, dtype=torch.bfloat16)  # 256 KiB
    gathered = torch.empty(shard.numel() * world, device=device, dtype=torch.bfloat16)
    scattered = torch.empty(shard.numel() // world, device=device, dtype=torch.bfloat16)
    a2a_out = torch.empty_like(shard)
    small = torch.randn(4096, device=device)

    def all_gather():
        dist.all_gather_into_tensor(gathered, shard)

    def hot_loop():
        dist.all_gather_into_tensor(gathered, shard)
        dist.reduce_scatter_tensor(scattered, shard)
        dist.all_to_all_single(a2a_out, shard)

    def mixed_loop():
        hot_loop()
        dist.all_reduce(small)
        dist.broadcast(small, src=0)

    results: dict = {
        "mem_get_info_us": _per_call_us(torch.cuda.mem_get_info, calls=500),
        "host_overhead_skipped_us": _host_overhead_us(comm_ops.DEFAULT_SKIP_OPS),
    }
    modes = {"no_guard": None, "default_policy": comm_ops.DEFAULT_SKIP_OPS, "all_checked": ()}
    benches = {"all_gather_256KiB": (all_gather, CALLS), "hot_loop": (hot_loop, 400), "mixed_loop": (mixed_loop, 300)}
    samples: dict[str, list[float]] = {}
    names = list(modes)
    for round_index in range(ROUNDS):
        for mode in names[round_index % len(names) :] + names[: round_index % len(names)]:
            skip = modes[mode]
            if skip is not None:
                comm_guard.install(_policy(skip))
            try:
                for bench, (fn, calls) in benches.items():
                    samples.setdefault(f"{bench}_{mode}_us", []).append(_per_call_us(fn, calls))
            finally:
                comm_guard.uninstall()
    results.update({key: statistics.median(values) for key, values in samples.items()})
    raw = results["all_gather_256KiB_no_guard_us"]
    results["skipped_overhead_us"] = results["all_gather_256KiB_default_policy_us"] - raw
    results["checked_overhead_us"] = results["all_gather_256KiB_all_checked_us"] - raw
    for loop in ("hot_loop", "mixed_loop"):
        results[f"{loop}_default_throughput_pct"] = (
            100 * results[f"{loop}_no_guard_us"] / results[f"{loop}_default_policy_us"]
        )
        results[f"{loop}_all_checked_throughput_pct"] = (
            100 * results[f"{loop}_no_guard_us"] / results[f"{loop}_all_checked_us"]
        )
    gathered_results = [None] * world
    dist.all_gather_object(gathered_results, results)
    if dist.get_rank() == 0:
        record = {
            "date": date.today().isoformat(),
            "device": torch.cuda.get_device_name(),
            "gpus": world,
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "python": platform.python_version(),
            "calls": CALLS,
            "rounds": ROUNDS,
            "per_rank": gathered_results,
            "max_over_ranks": {k: max(r[k] for r in gathered_results) for k in results if k.endswith("_us")},
            "min_over_ranks": {k: min(r[k] for r in gathered_results) for k in results if k.endswith("_pct")},
        }
        with open(args.out, "w") as handle:
            json.dump(record, handle, indent=2)
        for key, value in sorted(record["max_over_ranks"].items()):
            print(f"{key:<45} {value:8.2f} (max over ranks)")
        for key, value in sorted(record["min_over_ranks"].items()):
            print(f"{key:<45} {value:8.2f} (min over ranks)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
