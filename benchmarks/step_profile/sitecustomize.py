"""Kernel profile of a few training steps of any loop built on Megatron-Core's schedules: gdnctl's trainer and
Megatron-Bridge's own `pretrain` alike, with neither changed.

Python imports `sitecustomize` at start-up from the first folder on its path that has one, so putting this folder
first on PYTHONPATH loads it into every process a launch starts. It wraps megatron-core's
`forward_backward_no_pipelining` (the schedule of one pipeline stage; `get_forward_backward_func` looks it up when
called) as the module is imported, counts the training calls (forward_only ones are left out), and on rank 0 runs
torch.profiler from the start of call START to the start of call START+N: N whole steps, optimizer included.

    GDNCTL_STEP_PROFILE=OUT_DIR:TAG:START:N PYTHONPATH=benchmarks/step_profile:$PYTHONPATH gdnctl launch ...
    GDNCTL_STEP_PROFILE=OUT_DIR:TAG:START:N PYTHONPATH=benchmarks/step_profile:$PYTHONPATH \\
        python3 benchmarks/megatron_bridge_loop.py --mode tuned

Writes OUT_DIR/TAG.prof.json (per step: wall time, the GPU's busy time as the union of kernel intervals, kernel time
by category, the idle gaps by length and the kernels that follow the longest ones, the CUDA runtime calls' host time)
and OUT_DIR/TAG.cpu.txt (torch.profiler's table by host time). Pick START after warm-up and any CUDA-graph capture.
The profiler slows the host, so compare wall times only between profiled runs; the categories come from kernel
names (CATEGORIES below), a first cut rather than an attribution by module.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

SPEC = os.environ.get("GDNCTL_STEP_PROFILE")
SCHEDULES = "megatron.core.pipeline_parallel.schedules"
# (category, regular expression on the kernel name); the first that matches wins.
CATEGORIES = (
    ("nccl", r"nccl"),
    ("gdn", r"chunk|fwd_h|bwd_dh|recompute_w|wy_|kkt|l2norm|solve_tril|cumsum|gated_delta|fused_recurrent|conv1d"),
    ("attention", r"flash|fmha|attn|cudnn"),
    ("gemm", r"gemm|sm90_xmma|cutlass|cublas|nvjet"),
    ("moe_permute", r"permut|sort|moe|topk|router|scatter|gather|index"),
    ("optimizer", r"multi_tensor|adam"),
    ("memcpy", r"memcpy|memset"),
    ("compiled", r"triton_"),
    ("elementwise", r"elementwise|vectorized|reduce|cat|copy|fill"),
)


def _gap_bucket(us: float) -> str:
    return (
        "<5us" if us < 5 else "5-20us" if us < 20 else "20-100us" if us < 100 else "100us-1ms" if us < 1000 else ">1ms"
    )


def summarize(prof, wall_s: float, steps: int, out_dir: str, tag: str) -> None:
    import collections
    import json
    import re

    from torch.autograd import DeviceType

    events = prof.events()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == DeviceType.CUDA)
    busy, gaps, start, end = 0.0, [], None, None
    for s, e, name in kernels:
        if end is None or s > end:
            if end is not None:
                busy += end - start
                gaps.append((s - end, name))
            start, end = s, e
        else:
            end = max(end, e)
    if end is not None:
        busy += end - start
    by_category, count_by_category = collections.Counter(), collections.Counter()
    by_kernel, count_by_kernel = collections.Counter(), collections.Counter()
    for s, e, name in kernels:
        by_kernel[name] += e - s
        count_by_kernel[name] += 1
        category = next((c for c, pattern in CATEGORIES if re.search(pattern, name, re.I)), "other")
        by_category[category] += e - s
        count_by_category[category] += 1
    after_gap, after_gap_count, histogram = collections.Counter(), collections.Counter(), collections.Counter()
    for gap, name in gaps:
        histogram[_gap_bucket(gap)] += gap
        if gap > 20:
            after_gap[name[:90]] += gap
            after_gap_count[name[:90]] += 1
    runtime, runtime_count = collections.Counter(), collections.Counter()
    for e in events:
        if e.device_type == DeviceType.CPU and e.name.startswith("cuda"):
            runtime[e.name] += e.self_cpu_time_total
            runtime_count[e.name] += 1

    def ms(us: float) -> float:
        return round(us / 1e3 / steps, 2)

    summary = {
        "tag": tag,
        "steps": steps,
        "wall_ms_per_step": round(wall_s * 1e3 / steps, 1),
        "gpu_busy_ms_per_step": ms(busy),
        "kernels_per_step": len(kernels) / steps,
        "kernel_ms_per_step": ms(sum(by_kernel.values())),
        "categories_ms_per_step": {c: ms(t) for c, t in by_category.most_common()},
        "category_kernels_per_step": {c: count_by_category[c] / steps for c in by_category},
        "gap_ms_per_step_by_length": {b: ms(t) for b, t in histogram.items()},
        "kernels_after_longest_gaps": [(n, ms(t), after_gap_count[n] / steps) for n, t in after_gap.most_common(40)],
        "top_kernels": [(n[:140], ms(t), count_by_kernel[n] / steps) for n, t in by_kernel.most_common(70)],
        "cuda_runtime_host_ms_per_step": [(n, ms(t), runtime_count[n] / steps) for n, t in runtime.most_common(15)],
    }
    with open(os.path.join(out_dir, f"{tag}.prof.json"), "w") as handle:
        json.dump(summary, handle, indent=1)
    with open(os.path.join(out_dir, f"{tag}.cpu.txt"), "w") as handle:
        handle.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=60, max_name_column_width=90))


def _profiled(schedule, out_dir: str, tag: str, first: int, steps: int):
    state = {"calls": 0, "profiler": None, "started": 0.0}

    def forward_backward(*args, **kwargs):
        import time

        import torch

        if kwargs.get("forward_only"):
            return schedule(*args, **kwargs)
        state["calls"] += 1
        if state["calls"] == first:
            torch.cuda.synchronize()
            state["profiler"] = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            )
            state["profiler"].__enter__()
            state["started"] = time.perf_counter()
        elif state["calls"] == first + steps and state["profiler"] is not None:
            torch.cuda.synchronize()
            wall = time.perf_counter() - state["started"]
            profiler, state["profiler"] = state["profiler"], None
            profiler.__exit__(None, None, None)
            summarize(profiler, wall, steps, out_dir, tag)
            print(
                f"step profile: {out_dir}/{tag}.prof.json ({wall / steps * 1e3:.1f} ms a step under the profiler)",
                file=sys.stderr,
                flush=True,
            )
        return schedule(*args, **kwargs)

    return forward_backward


class _WrapSchedulesOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, out_dir: str, tag: str, first: int, steps: int) -> None:
        self.settings = (out_dir, tag, first, steps)

    def find_spec(self, name, path, target=None):
        if name != SCHEDULES:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            module.forward_backward_no_pipelining = _profiled(module.forward_backward_no_pipelining, *self.settings)

        spec.loader.exec_module = exec_module
        return spec


if SPEC and os.environ.get("RANK", "0") == "0":
    _out, _tag, _first, _steps = SPEC.split(":")
    sys.meta_path.insert(0, _WrapSchedulesOnImport(_out, _tag, int(_first), int(_steps)))
