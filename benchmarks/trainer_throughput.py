"""Trainer throughput on the Qwen3.5-35B-A3B proxy: GDN kernel (FLA vs FlashQLA) and comm-guard policy.

The proxy (catalog id gdnctl/qwen3.5-35b-a3b-proxy, preset qwen3.5-35b-a3b-proxy-bench) keeps the real
hidden size, every attention and GDN head shape, the vocabulary and the expert width, with 8 layers instead
of 40 and 32 experts instead of 256. Each variant is a real `gdnctl launch` of that preset; the figure is the
median tokens/s over the steps after the first WARMUP_STEPS (those include allocator growth).

    python benchmarks/trainer_throughput.py kernels [--steps 8] [--out results.json]
    python benchmarks/trainer_throughput.py guard --gpus 2 [--steps 8] [--out results.json]

`kernels` compares gdn_backend fla and flashqla on one GPU; `guard` compares, on --gpus GPUs with data
parallel: the guard checking every collective (skip_ops: []), the default skip policy (slime PR #1947's
8 ops), and the guard off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PRESET = "qwen3.5-35b-a3b-proxy-bench"
WARMUP_STEPS = 2


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


def summarise(steps: list[dict]) -> dict:
    measured = steps[WARMUP_STEPS:]
    return {
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
        results[backend] = summarise(steps)
    results["flashqla_speedup"] = results["flashqla"]["tokens_per_s"] / results["fla"]["tokens_per_s"]
    return results


GUARD_POLICIES = {
    "guard-always": ["comm.memory_guard=true", "comm.skip_ops=[]"],
    "default-skip": ["comm.memory_guard=true"],
    "guard-off": ["comm.memory_guard=false"],
}


def guard(args, work: Path) -> dict:
    results = {}
    for name, sets in GUARD_POLICIES.items():
        steps = launch(work / name, [f"cluster.gpus_per_node={args.gpus}", f"kernels.gdn_backend={args.backend}",
                                     f"train.train_iters={args.steps}",
                                     f"train.global_batch_size={4 * args.gpus}", *sets])
        results[name] = summarise(steps)
    base = results["guard-always"]["tokens_per_s"]
    for name in GUARD_POLICIES:
        results[name]["vs_guard_always"] = results[name]["tokens_per_s"] / base
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("kernels", "guard"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--backend", default="flashqla", help="GDN kernel for the guard comparison")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--work-dir", type=Path, help="keep the run dirs here (default: a temporary dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work_dir or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        results = (kernels if args.what == "kernels" else guard)(args, work)
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
