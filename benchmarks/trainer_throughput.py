"""Trainer throughput on the Qwen3.5-35B-A3B proxy: GDN kernel (FLA vs FlashQLA) and comm-guard policy.

The proxy (catalog id gdnctl/qwen3.5-35b-a3b-proxy, preset qwen3.5-35b-a3b-proxy-bench) keeps the real
hidden size, every attention and GDN head shape, the vocabulary and the expert width, with 8 layers instead
of 40 and 32 experts instead of 256. Each variant is a real `gdnctl launch` of that preset; the figure is the
median tokens/s over the steps after the first WARMUP_STEPS (those include allocator growth).

    python benchmarks/trainer_throughput.py kernels [--steps 8] [--out results.json]
    python benchmarks/trainer_throughput.py guard --gpus 2 [--variants guard-off,...] [--out results.json]
    python benchmarks/trainer_throughput.py profile --backend fla [--steps 4] --out profile-fla.json

`kernels` compares gdn_backend fla and flashqla on one GPU; `guard` compares, on --gpus GPUs with data
parallel: the guard checking every collective (skip_ops: []), the default skip policy (slime PR #1947's
8 ops), and the guard off (--variants runs a subset, so the three can be spread over calls that each have a
time limit). `profile` runs the proxy in this process on one GPU and puts its last step under torch.profiler:
CUDA time by op (top 25, written beside --out) and how much of it the GDN kernel calls take, with the
adapter's part (the inputs Megatron hands over that are not contiguous, which the adapter copies).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PRESET = "qwen3.5-35b-a3b-proxy-bench"
WARMUP_STEPS = 2
# The trainer's record of its GDN kernel warm-up (first, next and warm call), beside metrics.jsonl.
KERNEL_WARM_UP_FILE = "kernel_warm_up.json"
TOP_OPS = 25
GDN_INPUTS = ("q", "k", "v", "g", "beta")
GDN_RANGE = "gdn forward (adapter + kernel)"


def launch(run_dir: Path, sets: list[str]) -> list[dict]:
    command = [sys.executable, "-m", "gdnctl", "launch", PRESET, "-o", str(run_dir), "--force"]
    for value in sets:
        command += ["--set", value]
    print("$ " + " ".join(command), flush=True)
    proc = subprocess.run(command, text=True, capture_output=True, check=False)
    log = run_dir.parent / f"{run_dir.name}.log"
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{run_dir.name} failed (exit {proc.returncode}); see {log}:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summarise(steps: list[dict], run_dir: Path) -> dict:
    measured = steps[WARMUP_STEPS:]
    warm_up = run_dir / KERNEL_WARM_UP_FILE
    return {
        "kernel_warm_up": json.loads(warm_up.read_text()) if warm_up.exists() else None,
        "tokens_per_s": statistics.median(s["tokens_per_second"] for s in measured),
        "step_s": statistics.median(s["seconds"] for s in measured),
        "tflops_per_gpu": statistics.median(s["tflops_per_gpu"] for s in measured),
        "peak_memory_gib": max(s["peak_memory_gib"] for s in measured),
        "first_step_s": steps[0]["seconds"],
        "losses": [round(s["loss"], 4) for s in steps],
    }


def kernels(args, work: Path) -> dict:
    results = {}
    for backend in ("fla", "flashqla"):
        steps = launch(work / backend, [f"kernels.gdn_backend={backend}", f"train.train_iters={args.steps}"])
        results[backend] = summarise(steps, work / backend)
    results["flashqla_speedup"] = results["flashqla"]["tokens_per_s"] / results["fla"]["tokens_per_s"]
    return results


GUARD_POLICIES = {
    "guard-always": ["comm.memory_guard=true", "comm.skip_ops=[]"],
    "default-skip": ["comm.memory_guard=true"],
    "guard-off": ["comm.memory_guard=false"],
}


def guard(args, work: Path) -> dict:
    results = {}
    for name in args.variants:
        steps = launch(work / name, [f"cluster.gpus_per_node={args.gpus}", f"kernels.gdn_backend={args.backend}",
                                     f"train.train_iters={args.steps}",
                                     f"train.global_batch_size={4 * args.gpus}", *GUARD_POLICIES[name]])
        results[name] = summarise(steps, work / name)
    if "guard-always" in results:
        base = results["guard-always"]["tokens_per_s"]
        for name in args.variants:
            results[name]["vs_guard_always"] = results[name]["tokens_per_s"] / base
    return results


def profile(args, work: Path) -> dict:
    """The proxy's job run in this process as a one-rank torchrun job, its last step profiled."""
    from gdnctl.runtime import __main__ as runtime

    run_dir = work / f"profile-{args.backend}"
    render(run_dir, [f"kernels.gdn_backend={args.backend}", f"train.train_iters={args.steps}"])
    config_path = run_dir / "engine.yaml"
    config = runtime.load_config(config_path)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=_free_port())
    # Before torch is imported: CUDA and its allocator read these when they initialise.
    runtime.apply_env(config.env)
    import torch

    from gdnctl.runtime.trainer import Trainer

    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA])
    noncontiguous = _annotate_gdn_calls()
    report = Trainer._report

    def report_and_profile(trainer, stats):
        report(trainer, stats)
        if stats.iteration == args.steps - 1:
            profiler.start()
        elif stats.iteration == args.steps:
            profiler.stop()

    Trainer._report = report_and_profile
    runtime.run_job(config, config_path)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if args.out:
        table = profiler.key_averages().table(sort_by="self_cuda_time_total", row_limit=TOP_OPS)
        args.out.with_name(f"{args.out.stem}-top{TOP_OPS}.txt").write_text(table)
    return {"backend": args.backend, "profiled_step_s": steps[-1]["seconds"],
            "unprofiled_step_s": steps[-2]["seconds"], "noncontiguous_gdn_inputs": sorted(noncontiguous),
            **_gdn_share(profiler.events()),
            "kernel_warm_up": json.loads((run_dir / KERNEL_WARM_UP_FILE).read_text())}


def render(run_dir: Path, sets: list[str]) -> None:
    command = [sys.executable, "-m", "gdnctl", "render", PRESET, "-o", str(run_dir), "--force"]
    for value in sets:
        command += ["--set", value]
    subprocess.run(command, check=True, capture_output=True)


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _annotate_gdn_calls() -> set[str]:
    """Wrap every GDN kernel call in a profiler range (adapter + kernel forward) and collect the names of
    the inputs that arrive non-contiguous: the adapter copies exactly those before calling the kernel."""
    import torch

    from gdnctl.runtime.gdn_kernels import GdnKernel

    seen: set[str] = set()
    call = GdnKernel.__call__

    def annotated(kernel, q, k, v, g, beta, **options):
        seen.update(name for name, tensor in zip(GDN_INPUTS, (q, k, v, g, beta)) if not tensor.is_contiguous())
        with torch.profiler.record_function(GDN_RANGE):
            return call(kernel, q, k, v, g, beta, **options)

    GdnKernel.__call__ = annotated
    return seen


def _gdn_share(events) -> dict:
    """GPU time of the profiled step and of the GDN kernel: the forward range and the backward autograd nodes.

    Sums the kernels each CPU-side op launched itself, so that every kernel counts once (the profiler also
    lists a GPU-side copy of each range, which would count it twice).
    """
    cpu_ops = [event for event in events if event.device_type.name == "CPU"]
    total = sum(kernel.duration for event in cpu_ops for kernel in event.kernels)
    gdn: dict[str, float] = {}
    for event in cpu_ops:
        name = event.name.lower()
        if event.name == GDN_RANGE or ("backward" in name and "gateddelta" in name):
            gdn[event.name] = gdn.get(event.name, 0.0) + event.device_time_total
    return {"step_gpu_ms": total / 1e3, "gdn_gpu_ms": {name: us / 1e3 for name, us in gdn.items()},
            "gdn_share": sum(gdn.values()) / total if total else None}


def _variants(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in GUARD_POLICIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown guard variant(s) {unknown}; choose from {list(GUARD_POLICIES)}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("kernels", "guard", "profile"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--backend", default="flashqla", help="GDN kernel for the guard comparison and profile")
    parser.add_argument("--variants", type=_variants, default=list(GUARD_POLICIES),
                        help=f"comma-separated guard variants to run (default: all of {', '.join(GUARD_POLICIES)})")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--work-dir", type=Path, help="keep the run dirs here (default: a temporary dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work_dir or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        results = {"kernels": kernels, "guard": guard, "profile": profile}[args.what](args, work)
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
