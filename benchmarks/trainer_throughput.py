"""Trainer throughput on the Qwen3.5-35B-A3B proxy: GDN kernel (FLA vs FlashQLA) and comm-guard policy.

The proxy (catalog id gdnctl/qwen3.5-35b-a3b-proxy, preset qwen3.5-35b-a3b-proxy-bench) keeps the real
hidden size, every attention and GDN head shape, the vocabulary and the expert width, with 8 layers instead
of 40 and 32 experts instead of 256.

    python benchmarks/trainer_throughput.py kernels [--steps 8] [--out results.json]
    python benchmarks/trainer_throughput.py builders [--steps 10] [--out results.json]
    python benchmarks/trainer_throughput.py interleaved --gpus 2 [--rounds 4] [--variants ...] [--out results.json]
    python benchmarks/trainer_throughput.py profile --backend fla [--steps 4] --out profile-fla.json
    python benchmarks/trainer_throughput.py context-parallel --gpus 2 --set cluster.gpu=h200 [--seq-length 32768]
    python benchmarks/trainer_throughput.py compare [--kernels fla,flashqla] [--rounds 3] [--steps 30] [--gpus 1]
        [--peer-mode tuned] [--campaign DIR] [--peer-cache-dir DIR] [--cross-kernel] [--json] [--out ...]
    python benchmarks/trainer_throughput.py report --campaign DIR [--cross-kernel] [--json] [--out ...]
    python benchmarks/trainer_throughput.py speed-options [--steps 10] [--with-torch-compile] [--out results.json]
    python benchmarks/trainer_throughput.py memory [--steps 3] [--out results.json]
    python benchmarks/trainer_throughput.py lora [--steps 10] [--lora-rank 32] [--out results.json]

Every mode takes --set KEY=VALUE (repeatable, as gdnctl's --set) for the preset, applied after the mode's own
settings so they win, e.g. `--set cluster.gpu=h200 --set cluster.gpus_per_node=2` for the builders on 2 H200s;
`gdnctl explain`'s estimates get the same overrides. (The proxy's CP=1 arm at 32k needs an H200: on an H100
validate refuses it, MEM001 115.7 GiB.)

`compare` runs gdnctl's launch of the proxy with its defaults beside Megatron-Bridge's own training loop
(benchmarks/megatron_bridge_loop.py, --peer-mode tuned or matched) on the same GPUs and shape, like for like
(benchmarks/peer_compare/ says how): the same GDN kernel on both sides, every environment switch gdnctl's launch sets
given to the peer too, one token stream, each side's steady window from two steps after its own CUDA-graph capture
(medians and memory peaks alike), one FLOPs count for both TFLOPS columns, and the arms alternating, gdnctl then the
peer on each kernel, over --rounds rounds. It prints each round's tokens/s, TFLOPS/GPU, MFU and ratio, the median and
spread of the ratio, the steady allocated and reserved peaks and `gdnctl explain`'s estimate; --cross-kernel adds
gdnctl on FlashQLA against the peer on FLA, labelled as not like for like. Everything it measured goes into the
--campaign directory (default runs/compare-DATE-TIME): campaign.json, each arm's step log and console log, gdnctl's
run dirs. `report --campaign DIR` recomputes the whole comparison from such a directory, through the same code.
benchmarks/device/fair_compare.sh runs the campaign detached on a lent GPU host.
`memory` runs the proxy in this process and attributes what stays allocated between steps to the code that
allocated it (torch's allocator history). `speed-options` runs the proxy with the speed options as `auto` decides
them, with each one off alone, and with all off (Megatron-Core's unfused paths): what each option saves, and every
arm's peak memory beside explain's estimate.
`lora` fine-tunes the proxy fully and saves its last step (an HF checkpoint with random weights), then trains LoRA
adapters (megatron-bridge's PEFT, the default targets) on that checkpoint as model.path, with an adapter per routed
expert and then with one shared by them: step time, real tokens/s and peak memory of each, beside explain's
estimate for each.
`builders` runs the proxy once per model builder (TE-free, then megatron-bridge with Transformer Engine), FLA both
times, and sets the peak memory beside `gdnctl explain`'s estimate. `kernels` runs one real `gdnctl launch` per GDN
backend on one GPU; the figure is the median over the steps
after the first WARMUP_STEPS (those include allocator growth). `context-parallel` runs the proxy with packed
sequences (THD) at --seq-length tokens per sequence on --gpus GPUs, CP=1 (data parallel) and then CP=2, the same
tokens per step: tokens/s and peak memory of each beside explain's estimate. Separate runs differ by 10-20% in step time
from machine and start-up alone, so `interleaved` is the comparison to trust: one training run on --gpus GPUs
(data parallel) switches the GDN kernel and the comm guard policy between steps and rotates through the
variants (BACKEND/POLICY[/pressure]): the guard checking every collective (guard-always), slime PR #1947's
skip set (default-skip), nothing checked (guard-off: the wrappers stay, ~1.5 us a call), and with
--recommended-from RUN_DIR the set `gdnctl comm-report RUN_DIR` recommends (recommended); "pressure" raises
the threshold above the free memory, so every checked collective takes the clear path, as in a run whose GPU
is nearly full; each measured pressured step follows an unmeasured one of its own variant, since the step after a
clear pays to refill the allocator's cache. `profile` runs the proxy in this process on one GPU and puts its last
step under torch.profiler: CUDA time by op (top 25, written beside --out) and how much of it the GDN kernel calls take,
with the adapter's part (the inputs Megatron hands over that are not contiguous, which the adapter copies).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from peer_compare.plan import DEFAULT_ROUNDS, KERNELS
from peer_compare.report import report_directory as compare_report
from peer_compare.report import table as compare_table
from peer_compare.runner import CampaignRun, RenderFailed

from gdnctl.knowledge.gdn_backends import GDN_BACKENDS

PRESET = "qwen3.5-35b-a3b-proxy-bench"
WARMUP_STEPS = 2
# The trainer's record of its GDN kernel warm-up (first, next and warm call), beside metrics.jsonl.
KERNEL_WARM_UP_FILE = "kernel_warm_up.json"
STARTUP_FILE = "startup.json"
TOP_OPS = 25
GDN_INPUTS = ("q", "k", "v", "g", "beta")
GDN_RANGE = "gdn forward (adapter + kernel)"


def _set_options(sets: list[str]) -> list[str]:
    return [option for value in sets for option in ("--set", value)]


def launch(run_dir: Path, sets: list[str]) -> list[dict]:
    command = [sys.executable, "-m", "gdnctl", "launch", PRESET, "-o", str(run_dir), "--force", *_set_options(sets)]
    print("$ " + shlex.join(command), flush=True)
    proc = subprocess.run(command, text=True, capture_output=True, check=False)
    log = run_dir.parent / f"{run_dir.name}.log"
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{run_dir.name} failed (exit {proc.returncode}); see {log}:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summarise(steps: list[dict], run_dir: Path) -> dict:
    measured = steps[WARMUP_STEPS:]
    warm_up = run_dir / KERNEL_WARM_UP_FILE
    startup = run_dir / STARTUP_FILE
    return {
        "kernel_warm_up": json.loads(warm_up.read_text()) if warm_up.exists() else None,
        # rank 0's time to the end of step 1, by phase (runtime/train/startup.py)
        "startup": json.loads(startup.read_text()) if startup.exists() else None,
        "tokens_per_s": statistics.median(s["tokens_per_second"] for s in measured),
        "step_s": statistics.median(s["seconds"] for s in measured),
        "tflops_per_gpu": statistics.median(s["tflops_per_gpu"] for s in measured),
        "peak_memory_gib": max(s["peak_memory_gib"] for s in measured),
        "peak_reserved_gib": max(s.get("peak_reserved_gib", 0.0) for s in measured),
        # What a step holds at rest (weights, gradient buffers, optimizer state) and what it adds on top.
        "resident_memory_gib": max(s["resident_memory_gib"] for s in measured),
        "step_added_memory_gib": max(s["peak_memory_gib"] - s["resident_memory_gib"] for s in measured),
        "first_step_s": steps[0]["seconds"],
        "losses": [round(s["loss"], 4) for s in steps],
    }


# The trainer's two model builders (runtime/model/builders.py), by the preset's runtime.transformer_engine.
BUILDERS = {"te-free": ["runtime.transformer_engine=none"], "megatron-bridge": []}


def builders(args, work: Path) -> dict:
    """The proxy on each model builder, one launch after the other on the same GPU and the same FLA kernel: tokens/s,
    model TFLOPS/GPU and MFU, and the peak memory against `gdnctl explain`'s estimate for the preset."""
    estimate = explain_memory(args.set)
    results = {"explain_estimate_gib": estimate}
    for builder, sets in BUILDERS.items():
        steps = launch(work / builder, [*sets, "kernels.gdn_backend=fla", f"train.train_iters={args.steps}", *args.set])
        results[builder] = summarise(steps, work / builder)
        results[builder]["mfu"] = statistics.median(s["mfu"] for s in steps[WARMUP_STEPS:] if s["mfu"] is not None)
    results["bridge_speedup"] = results["megatron-bridge"]["tokens_per_s"] / results["te-free"]["tokens_per_s"]
    return results


def compare(args, work: Path) -> dict:
    """The like-for-like campaign (peer_compare/runner.py), then its report from what it recorded."""
    directory = args.campaign or Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    args.preset = PRESET
    try:
        CampaignRun(args, directory, explain_memory).run()
    except RenderFailed as error:
        raise SystemExit(f"compare: the preset does not render, so no arm ran:\n{error}") from None
    return compare_report(directory, cross_kernel=args.cross_kernel)


def report(args, work: Path) -> dict:
    """A campaign recorded earlier, recomputed from its directory alone."""
    if args.campaign is None:
        raise SystemExit("report: pass --campaign DIR, the directory `compare` recorded")
    try:
        return compare_report(args.campaign, cross_kernel=args.cross_kernel)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"report: {error}") from None


# The speed options (gdnctl/plan/speed.py) and the value that turns each one off.
SPEED_OFF = {
    "router_fusion": "off",
    "bias_activation_fusion": "off",
    "rope_fusion": "off",
    "cross_entropy": "native",
    "wgrad_fusion": "off",
    "grad_reduce": "fp32",
    "manual_gc": "off",
    "cuda_graphs": "off",
    "overlap_grad_reduce": "off",
    "cutlass_grouped_gemm": "off",
}


def speed_options(args, work: Path) -> dict:
    """The proxy with every speed option as `auto` decides it, then with each one turned off alone, then with all of
    them off: step time, tokens/s and peak memory beside explain's estimate, and each option's share of the step."""
    base = [f"train.train_iters={args.steps}", *args.set]
    chosen = SPEED_OFF if args.options is None else {name: SPEED_OFF[name] for name in args.options}
    arms = {
        "all-auto": [],
        **{f"{name}-off": [f"speed.{name}={off}"] for name, off in chosen.items()},
        "all-off": [f"speed.{name}={off}" for name, off in SPEED_OFF.items()],
    }
    if args.with_torch_compile:
        # Not a speed option (kernels.torch_compile, off by default): the same step with Megatron-Core's, TE's and
        # FLA's torch.compile'd functions compiled, as Megatron-Bridge's tuned recipe runs them.
        arms["torch_compile-on"] = ["kernels.torch_compile=true"]
    results: dict = {}
    for arm, sets in arms.items():
        steps = launch(work / arm, [*base, *sets])
        results[arm] = summarise(steps, work / arm)
        results[arm]["explain_estimate_gib"] = explain_memory([*base, *sets])
    auto_step = results["all-auto"]["step_s"]
    results["step_s_added_when_off"] = {
        arm.removesuffix("-off"): round(results[arm]["step_s"] - auto_step, 4) for arm in arms if arm.endswith("-off")
    }
    if "torch_compile-on" in results:
        results["step_s_added_by_torch_compile"] = round(results["torch_compile-on"]["step_s"] - auto_step, 4)
    return results


def explain_memory(sets: list[str]) -> dict:
    """`gdnctl explain`'s training-phase memory table for the preset: total, the part torch allocates (the
    estimate less its CUDA-context/NCCL overhead row, which max_memory_allocated does not see), and that part split
    as the trainer's metrics split it: resident between steps, and what a step adds."""
    from gdnctl.plan import RESIDENT_ROWS

    command = [sys.executable, "-m", "gdnctl", "explain", PRESET, "--json", *_set_options(sets)]
    memory = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)["memory"]
    rows = {row["name"]: row["gib"] for row in memory["rows"]}
    resident = sum(rows.get(name, 0.0) for name in RESIDENT_ROWS)
    allocated = memory["total_gib"] - rows.get("overhead", 0.0)
    return {
        "total_gib": memory["total_gib"],
        "allocated_gib": round(allocated, 3),
        "resident_gib": round(resident, 3),
        "step_added_gib": round(allocated - resident, 3),
    }


def lora(args, work: Path) -> dict:
    """Full fine-tuning against LoRA on the same proxy, GPU and rows. The full run's last checkpoint is the LoRA
    run's frozen base: the base must come from a directory (TRN022), and the proxy has no released weights."""
    saved = work / "full-save"
    full_sets = [
        f"train.train_iters={args.steps}",
        f"train.save_dir={saved}",
        f"train.save_interval={args.steps}",
        *args.set,
    ]
    base = saved / f"iter_{args.steps:07d}"
    lora_sets = [
        f"train.train_iters={args.steps}",
        f"model.path={base}",
        f"train.lora.rank={args.lora_rank}",
        f"train.lora.alpha={args.lora_rank}",  # megatron-bridge's LoRA default scale, alpha / rank = 1
        *args.set,
    ]
    results: dict = {}
    arms = (
        ("full", full_sets),
        ("lora", [*lora_sets, "train.lora.expert_adapters=per_expert"]),  # the routed experts with an adapter each
        ("lora_shared_experts", [*lora_sets, "train.lora.expert_adapters=shared"]),  # what auto picks at ep 1
    )
    for arm, sets in arms:
        steps = launch(work / arm, sets)
        results[arm] = {**summarise(steps, work / arm), "explain_estimate_gib": explain_memory(sets)}
    for arm, _ in arms[1:]:
        results[f"{arm}_step_time_ratio"] = results[arm]["step_s"] / results["full"]["step_s"]
        results[f"{arm}_peak_memory_ratio"] = results[arm]["peak_memory_gib"] / results["full"]["peak_memory_gib"]
    return results


def kernels(args, work: Path) -> dict:
    results = {}
    for backend in ("fla", "flashqla"):
        steps = launch(work / backend, [f"kernels.gdn_backend={backend}", f"train.train_iters={args.steps}", *args.set])
        results[backend] = summarise(steps, work / backend)
    results["flashqla_speedup"] = results["flashqla"]["tokens_per_s"] / results["fla"]["tokens_per_s"]
    return results


def context_parallel_sets(args, cp: int) -> list[str]:
    """One arm of `context-parallel`: packed sequences (CP needs THD: LAY004), the same global batch for both CP
    sizes, so each step trains the same number of tokens."""
    return [
        "train.layout=thd",
        f"parallel.cp={cp}",
        f"cluster.gpus_per_node={args.gpus}",
        f"train.seq_length={args.seq_length}",
        f"train.train_iters={args.steps}",
        *args.set,
    ]


def context_parallel(args, work: Path) -> dict:
    """CP=1 against CP=2 at --seq-length tokens per sequence on --gpus GPUs: tokens/s and peak memory of each
    beside explain's estimate for it."""
    results = {}
    for cp in (1, 2):
        sets = context_parallel_sets(args, cp)
        results[f"cp{cp}"] = {
            **summarise(launch(work / f"cp{cp}", sets), work / f"cp{cp}"),
            "explain_estimate_gib": explain_memory(sets),
        }
    results["cp2_tokens_per_s_ratio"] = results["cp2"]["tokens_per_s"] / results["cp1"]["tokens_per_s"]
    return results


GUARD_POLICIES = ("guard-always", "default-skip", "guard-off")
# Only with --recommended-from RUN_DIR: the skip set `gdnctl comm-report RUN_DIR` recommends.
RECOMMENDED = "recommended"
# Above any GPU's free memory: every checked collective takes the guard's clear path (synchronize, gc.collect,
# empty_cache), as it does in a real run whose free memory sits below comm.free_gb_threshold (slime: 3 GB).
PRESSURE_THRESHOLD_GIB = 1.0e6


@dataclass(frozen=True)
class Variant:
    """One arm of the interleaved comparison: GDN kernel, comm guard policy, and whether memory is short."""

    backend: str
    policy: str
    pressure: bool

    @property
    def name(self) -> str:
        return f"{self.backend}/{self.policy}" + ("/pressure" if self.pressure else "")

    @classmethod
    def parse(cls, text: str) -> Variant:
        parts = text.split("/")
        if (
            len(parts) not in (2, 3)
            or parts[0] not in GDN_BACKENDS
            or (parts[1] not in (*GUARD_POLICIES, RECOMMENDED))
            or (len(parts) == 3 and parts[2] != "pressure")
        ):
            raise argparse.ArgumentTypeError(
                f"variant {text!r} is not BACKEND/POLICY[/pressure] with BACKEND one of {', '.join(GDN_BACKENDS)} "
                f"and POLICY one of {', '.join((*GUARD_POLICIES, RECOMMENDED))}"
            )
        return cls(parts[0], parts[1], len(parts) == 3)

    def comm_policy(self, default_skip: frozenset[str], recommended: frozenset[str] | None):
        from gdnctl.runtime.comm.guard import CommGuardPolicy
        from gdnctl.schema import comm_ops

        skip = {
            "guard-always": frozenset(),
            "default-skip": default_skip,
            "guard-off": comm_ops.ALL_OPS,
            RECOMMENDED: recommended,
        }
        threshold = PRESSURE_THRESHOLD_GIB if self.pressure else 3.0
        return CommGuardPolicy(threshold, skip[self.policy], profile=False)


@dataclass(frozen=True)
class PlannedStep:
    """One step of the interleaved run: its variant, and whether its time counts."""

    variant: Variant
    measured: bool


def step_plan(variants: list[Variant], rounds: int) -> list[PlannedStep]:
    """The order steps run in: unpressured variants first, then pressured ones; each group starts with one warm-up
    round that is not measured, then `rounds` rounds, each a rotation of the one before, so no variant always
    follows the same neighbour. Under pressure the guard's clear path empties the allocator's cache, and the step
    after one that did pays to refill it (~15% of a step on four H100s at EP4): a variant that skips every check
    would be charged for its neighbour. So each measured pressured step follows an unmeasured step of its own
    variant, and under pressure a variant's time is what it costs in a run that uses it every step."""
    plan = []
    for group in ([v for v in variants if not v.pressure], [v for v in variants if v.pressure]):
        for index in range(rounds + 1 if group else 0):
            shift = index % len(group)
            for variant in group[shift:] + group[:shift]:
                if index and variant.pressure:
                    plan.append(PlannedStep(variant, measured=False))
                plan.append(PlannedStep(variant, measured=index > 0))
    return plan


def interleaved(args, work: Path) -> dict:
    """Every variant's steps in one training run, interleaved: the kernel and the guard policy are switched
    between steps, so start-up, machine and drift are the same for all of them."""
    plan = step_plan(args.variants, args.rounds)
    recommended = None
    if args.recommended_from is not None:
        from gdnctl.launch.comm_report import build_report

        recommended = list(build_report(args.recommended_from).recommended_skip_ops)
        print(f"recommended skip set from {args.recommended_from}: {recommended}", flush=True)
    elif any(step.variant.policy == RECOMMENDED for step in plan):
        raise SystemExit(
            "a 'recommended' variant needs --recommended-from RUN_DIR (a run profiled with comm.profile: true)"
        )
    # --profile: one more step per variant after the measured ones, each under torch.profiler (not in the medians).
    profiled = list(dict.fromkeys(step.variant for step in plan)) if args.profile else []
    run_dir = work / "interleaved"
    render(
        run_dir,
        [
            f"cluster.gpus_per_node={args.gpus}",
            f"train.global_batch_size={4 * args.gpus}",
            f"train.train_iters={len(plan) + len(profiled)}",
            "comm.memory_guard=true",
            *args.set,
        ],
    )
    (run_dir / "plan.json").write_text(
        json.dumps(
            {
                "steps": [step.variant.name for step in plan] + [v.name for v in profiled],
                "profile_from": len(plan),
                "recommended_skip_ops": recommended,
            }
        )
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={args.gpus}",
        f"--master-port={_free_port()}",
        __file__,
        "rank",
        "--work-dir",
        str(run_dir),
    ]
    print("$ " + shlex.join(command), flush=True)
    log = work / "interleaved.log"
    with log.open("w") as handle:
        proc = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"interleaved run failed (exit {proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    train = yaml.safe_load((run_dir / "engine.yaml").read_text())["train"]
    # The preset's bshd layout pads every row to seq_length, so each step computes the same tokens whatever the
    # data; the real-token rate moves with the lengths a step happens to draw.
    padded_tokens = train["global_batch_size"] * train["seq_length"]
    results = summarise_interleaved(
        plan, steps[: len(plan)], args.rounds, json.loads((run_dir / "warm_ups.json").read_text()), padded_tokens
    )
    if profiled:
        results["profiled_steps"] = json.loads((run_dir / PROFILED_STEPS_FILE).read_text())
        results["kernel_win_delivered"] = kernel_win_delivered(results["variants"], results["profiled_steps"])
    return results


PROFILED_STEPS_FILE = "profiled_steps.json"


def kernel_win_delivered(variants: dict, profiled: dict) -> dict:
    """Per guard policy: the step time FlashQLA saves over FLA (medians of the measured steps) against the GDN
    kernel time it saves (the profiled step of each): 1.0 means the switch hands the kernel's whole win to the step."""
    delivered = {}
    for name, fla in variants.items():
        other = name.replace("fla/", "flashqla/", 1)
        if not name.startswith("fla/") or other not in variants or name not in profiled or other not in profiled:
            continue
        step_saved = fla["step_s"] - variants[other]["step_s"]
        kernel_saved = (sum(profiled[name]["gdn_gpu_ms"].values()) - sum(profiled[other]["gdn_gpu_ms"].values())) / 1e3
        delivered[name.removeprefix("fla/")] = {
            "step_saved_s": round(step_saved, 4),
            "gdn_kernel_saved_s": round(kernel_saved, 4),
            "fraction": step_saved / kernel_saved if kernel_saved > 0 else None,
            "gdn_share_fla": profiled[name]["gdn_share"],
            "gdn_share_flashqla": profiled[other]["gdn_share"],
        }
    return delivered


def summarise_interleaved(
    plan: list[PlannedStep], steps: list[dict], rounds: int, warm_ups: dict, padded_tokens_per_step: int
) -> dict:
    by_variant: dict[str, list[dict]] = {}
    for planned, step in zip(plan, steps, strict=True):
        if planned.measured:
            by_variant.setdefault(planned.variant.name, []).append(step)
    variants = {}
    for name, measured in by_variant.items():
        assert len(measured) == rounds
        variants[name] = {
            "step_s": statistics.median(s["seconds"] for s in measured),
            "padded_tokens_per_s": padded_tokens_per_step / statistics.median(s["seconds"] for s in measured),
            "real_tokens_per_s": statistics.median(s["tokens_per_second"] for s in measured),
            "tflops_per_gpu": statistics.median(s["tflops_per_gpu"] for s in measured),
            "peak_memory_gib": max(s["peak_memory_gib"] for s in measured),
            "steps_s": [round(s["seconds"], 3) for s in measured],
        }

    def ratio(numerator: str, denominator: str) -> float | None:
        if numerator in variants and denominator in variants:
            return variants[denominator]["step_s"] / variants[numerator]["step_s"]
        return None

    speedups = {}
    for suffix in ("", "/pressure"):
        for policy in (*GUARD_POLICIES, RECOMMENDED):
            speedups[f"flashqla vs fla, {policy}{suffix}"] = ratio(
                f"flashqla/{policy}{suffix}", f"fla/{policy}{suffix}"
            )
        for backend in GDN_BACKENDS:
            for policy in ("default-skip", "guard-off", RECOMMENDED):
                speedups[f"{policy} vs guard-always, {backend}{suffix}"] = ratio(
                    f"{backend}/{policy}{suffix}", f"{backend}/guard-always{suffix}"
                )
    # slime PR #1947's before/after: FLA with every collective checked -> FlashQLA with its skip set.
    speedups["flashqla/default-skip vs fla/guard-always, pressure"] = ratio(
        "flashqla/default-skip/pressure", "fla/guard-always/pressure"
    )
    return {
        "variants": variants,
        "speedups": {k: v for k, v in speedups.items() if v is not None},
        "kernel_warm_up": warm_ups,
        "order": [step.variant.name + ("" if step.measured else " (not measured)") for step in plan],
        "all_steps_s": [round(s["seconds"], 3) for s in steps],
    }


def rank(args) -> None:
    """One torchrun rank of the interleaved run: the proxy's trainer, its `_report` hook switching the kernel
    and the guard policy before each step as plan.json says."""
    from gdnctl.runtime import __main__ as runtime
    from gdnctl.schema import comm_ops

    run_dir = args.work_dir
    config_path = run_dir / "engine.yaml"
    config = runtime.load_config(config_path)
    planned = json.loads((run_dir / "plan.json").read_text())
    plan = [Variant.parse(name) for name in planned["steps"]]
    profile_from = planned["profile_from"]
    recommended = planned["recommended_skip_ops"]
    recommended = None if recommended is None else frozenset(recommended)
    runtime.apply_env(config.env)
    import torch
    import torch.distributed as dist

    from gdnctl.runtime.comm import guard as comm_guard
    from gdnctl.runtime.comm.guard import CommGuardPolicy
    from gdnctl.runtime.kernels.backends import install_kernel_on_layers, patch_megatron_gdn_kernel, resolve_backend
    from gdnctl.runtime.train.trainer import Trainer

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.cuda.init()
    dist.init_process_group("cpu:gloo,cuda:nccl")
    trainer = Trainer(config, config_path, CommGuardPolicy.from_engine(config.comm, run_dir))
    trainer.setup()
    kernels = {name: resolve_backend(name) for name in GDN_BACKENDS}
    warm_ups = {}
    for name, kernel in kernels.items():
        trainer.kernel = kernel
        warm_ups[name] = trainer.warm_up_kernel().__dict__
    if trainer.rank == 0:
        (run_dir / "warm_ups.json").write_text(json.dumps(warm_ups))
    default_skip = frozenset(comm_ops.DEFAULT_SKIP_OPS)

    def use(variant: Variant) -> None:
        patch_megatron_gdn_kernel(kernels[variant.backend])
        install_kernel_on_layers(trainer.model, kernels[variant.backend])
        comm_guard.set_policy(variant.comm_policy(default_skip, recommended))

    report = Trainer._report
    if profile_from < len(plan):
        _annotate_gdn_calls()
    profiled: dict[str, dict] = {}
    running: list = []  # the profiler of the step under way, if it is profiled

    def report_and_switch(self, stats):
        if running:
            profiler = running.pop()
            profiler.stop()
            profiled[plan[stats.iteration - 1].name] = {"step_s": stats.seconds, **_gdn_share(profiler.events())}
        report(self, stats)
        if stats.iteration < len(plan):
            use(plan[stats.iteration])
            if stats.iteration >= profile_from:
                running.append(
                    torch.profiler.profile(
                        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                    )
                )
                running[0].start()

    Trainer._report = report_and_switch
    use(plan[0])
    try:
        trainer.train()
        if trainer.rank == 0 and profile_from < len(plan):
            (run_dir / PROFILED_STEPS_FILE).write_text(json.dumps(profiled, indent=1))
    finally:
        # The CUDA graphs go first: while one lives, destroying the process group waits forever (Trainer.close).
        trainer.close()
        dist.destroy_process_group()


def profile(args, work: Path) -> dict:
    """The proxy's job run in this process as a one-rank torchrun job, its last step profiled."""
    from gdnctl.runtime import __main__ as runtime

    run_dir = work / f"profile-{args.backend}"
    render(run_dir, [f"kernels.gdn_backend={args.backend}", f"train.train_iters={args.steps}", *args.set])
    config_path = run_dir / "engine.yaml"
    config = runtime.load_config(config_path)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=_free_port())
    # Before torch is imported: CUDA and its allocator read these when they initialise.
    runtime.apply_env(config.env)
    import torch

    from gdnctl.runtime.train.trainer import Trainer

    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    )
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
        averages = profiler.key_averages()
        table = averages.table(sort_by="self_cuda_time_total", row_limit=TOP_OPS)
        args.out.with_name(f"{args.out.stem}-top{TOP_OPS}.txt").write_text(table)
        # A step whose GPU time is well under its wall time waits on the host: the ops that hold the CPU longest.
        cpu_table = averages.table(sort_by="self_cpu_time_total", row_limit=TOP_OPS)
        args.out.with_name(f"{args.out.stem}-cpu-top{TOP_OPS}.txt").write_text(cpu_table)
    return {
        "backend": args.backend,
        "profiled_step_s": steps[-1]["seconds"],
        "unprofiled_step_s": steps[-2]["seconds"],
        "noncontiguous_gdn_inputs": sorted(noncontiguous),
        **_gdn_share(profiler.events()),
        "kernel_warm_up": json.loads((run_dir / KERNEL_WARM_UP_FILE).read_text()),
    }


def memory(args, work: Path) -> dict:
    """What stays allocated between steps, by where it was allocated: the proxy's job in this process, torch's
    allocator history recorded from the start, a snapshot taken when step N-1 ends (before step N allocates), its
    live blocks grouped by the innermost gdnctl/megatron/transformer_engine/fla frame that allocated them."""
    from gdnctl.runtime import __main__ as runtime

    run_dir = work / "memory"
    render(run_dir, [f"train.train_iters={args.steps}", *args.set])
    config_path = run_dir / "engine.yaml"
    config = runtime.load_config(config_path)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=_free_port())
    runtime.apply_env(config.env)
    import torch

    from gdnctl.runtime.train.trainer import Trainer

    torch.cuda.memory._record_memory_history(max_entries=200_000)
    snapshot: dict = {}
    report = Trainer._report

    def report_and_snapshot(trainer, stats):
        report(trainer, stats)
        if stats.iteration == args.steps - 1:
            snapshot["value"] = torch.cuda.memory._snapshot()
            snapshot["allocated_gib"] = torch.cuda.memory_allocated() / 2**30

    Trainer._report = report_and_snapshot
    runtime.run_job(config, config_path)
    by_site: dict[str, int] = {}
    for segment in snapshot["value"]["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            frames = block.get("frames") or []
            site = next(
                (
                    f"{frame['filename'].split('site-packages/')[-1]}:{frame['line']} {frame['name']}"
                    for frame in frames
                    if any(part in frame["filename"] for part in ("gdnctl", "megatron", "transformer_engine", "fla"))
                ),
                "(no Python frame)",
            )
            by_site[site] = by_site.get(site, 0) + block["size"]
    top = sorted(by_site.items(), key=lambda item: -item[1])[:TOP_OPS]
    return {
        "allocated_between_steps_gib": round(snapshot["allocated_gib"], 3),
        "by_site_gib": {site: round(size / 2**30, 3) for site, size in top},
    }


def render(run_dir: Path, sets: list[str]) -> None:
    command = [sys.executable, "-m", "gdnctl", "render", PRESET, "-o", str(run_dir), "--force", *_set_options(sets)]
    subprocess.run(command, check=True, capture_output=True)


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _annotate_gdn_calls() -> set[str]:
    """Wrap every GDN kernel call in a profiler range (adapter + kernel forward) and collect the names of
    the inputs that arrive non-contiguous: the adapter copies exactly those before calling the kernel."""
    import torch

    from gdnctl.runtime.kernels.backends import GdnKernel

    seen: set[str] = set()
    call = GdnKernel.__call__

    def annotated(kernel, q, k, v, g, beta, **options):
        seen.update(
            name for name, tensor in zip(GDN_INPUTS, (q, k, v, g, beta), strict=True) if not tensor.is_contiguous()
        )
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
        # The backward node appears twice: as itself and inside autograd's evaluate_function wrapper; count it once.
        wrapper = name.startswith("autograd::engine::evaluate_function")
        if event.name == GDN_RANGE or ("backward" in name and "gateddelta" in name and not wrapper):
            gdn[event.name] = gdn.get(event.name, 0.0) + event.device_time_total
    return {
        "step_gpu_ms": total / 1e3,
        "gdn_gpu_ms": {name: us / 1e3 for name, us in gdn.items()},
        "gdn_share": sum(gdn.values()) / total if total else None,
    }


DEFAULT_VARIANTS = [
    Variant(backend, policy, pressure)
    for pressure in (False, True)
    for backend in GDN_BACKENDS
    for policy in GUARD_POLICIES
]


def _kernel_list(text: str) -> list[str]:
    """--kernels: GDN kernels both gdnctl and Megatron-Bridge's loop can run, checked before any launch spends GPU
    time."""
    kernels = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [kernel for kernel in kernels if kernel not in KERNELS]
    if not kernels or unknown or len(set(kernels)) != len(kernels):
        raise argparse.ArgumentTypeError(f"{text!r}: name GDN kernels from {', '.join(KERNELS)}, comma-separated")
    return kernels


def _variant_list(text: str) -> list[Variant]:
    variants = [Variant.parse(part.strip()) for part in text.split(",") if part.strip()]
    if not variants:
        raise argparse.ArgumentTypeError("name at least one BACKEND/POLICY[/pressure] variant")
    return variants


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "what",
        choices=(
            "kernels",
            "builders",
            "interleaved",
            "profile",
            "context-parallel",
            "compare",
            "report",
            "speed-options",
            "memory",
            "lora",
            "rank",
        ),
        help="rank: one torchrun rank of `interleaved` (started by it); report: a recorded `compare` campaign",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="kernels, builders, profile, context-parallel, lora: steps per run (default 8); compare: steps per arm "
        "(default 30)",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="interleaved: GPUs, data parallel (default 2); context-parallel: GPUs (default 2); "
        "compare: GPUs of both runs (default 1)",
    )
    parser.add_argument(
        "--peer-mode",
        choices=("tuned", "matched"),
        default="tuned",
        help="compare: Megatron-Bridge's performance-recipe options, or the options gdnctl sets",
    )
    parser.add_argument(
        "--kernels",
        type=_kernel_list,
        default=["fla", "flashqla"],
        help="compare: GDN kernels (default fla,flashqla): gdnctl's launch on each, paired with the peer on the same",
    )
    parser.add_argument(
        "--campaign",
        type=Path,
        metavar="DIR",
        help="compare: where the campaign's record goes (default runs/compare-DATE-TIME); report: the one to read",
    )
    parser.add_argument(
        "--peer-cache-dir",
        type=Path,
        default=Path("~/.cache/gdnctl/megatron-bridge-peer").expanduser(),
        help="compare: the peer's own kernel cache, laid out as gdnctl's (default "
        "~/.cache/gdnctl/megatron-bridge-peer)",
    )
    parser.add_argument(
        "--cross-kernel",
        action="store_true",
        help="compare, report: add gdnctl on FlashQLA against the peer on FLA, labelled as not like for like",
    )
    parser.add_argument(
        "--arm-timeout-s",
        type=float,
        default=900.0,
        help="compare: an arm still running after this is stopped and reported failed (default 900)",
    )
    parser.add_argument(
        "--stop-after-s",
        type=float,
        default=None,
        help="compare: start no new pair of arms once the campaign has run this long (its record says which did not)",
    )
    parser.add_argument(
        "--json", action="store_true", help="compare, report: print the result as one JSON object, not the table"
    )
    parser.add_argument(
        "--options",
        type=lambda text: [] if text == "none" else text.split(","),
        default=None,
        help="speed-options: the options turned off one at a time (default: every one; none: only all on and all off)",
    )
    parser.add_argument(
        "--with-torch-compile", action="store_true", help="speed-options: one more arm with kernels.torch_compile: true"
    )
    parser.add_argument("--seq-length", type=int, default=32768, help="context-parallel: tokens per sequence")
    parser.add_argument("--lora-rank", type=int, default=32, help="lora: the adapters' rank (alpha the same)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"interleaved: measured steps per variant (default 4); compare: rounds of arms (default {DEFAULT_ROUNDS})",
    )
    parser.add_argument("--backend", default="flashqla", help="profile: GDN kernel")
    parser.add_argument(
        "--variants",
        type=_variant_list,
        default=DEFAULT_VARIANTS,
        help="interleaved: comma-separated BACKEND/POLICY[/pressure] (default: every backend and "
        "policy but 'recommended', with and without memory pressure)",
    )
    parser.add_argument(
        "--recommended-from",
        type=Path,
        metavar="RUN_DIR",
        help="interleaved: a run profiled with comm.profile: true; the POLICY 'recommended' is "
        "the skip set `gdnctl comm-report RUN_DIR` recommends",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="interleaved: after the measured rounds, one more step per variant under torch.profiler; "
        "reports each one's GDN kernel time and how much of FlashQLA's win reaches the step",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a preset override, as gdnctl's --set (repeatable; wins over the mode's own)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--work-dir", type=Path, help="keep the run dirs here (default: a temporary dir)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, with each mode's own defaults where the mode was silent."""
    parser = build_parser()
    args = parser.parse_args(argv)
    compare_like = args.what in ("compare", "report")
    if args.gpus is None:
        args.gpus = 1 if compare_like else 2
    if args.steps is None:
        args.steps = 30 if compare_like else 8
    if args.rounds is None:
        args.rounds = DEFAULT_ROUNDS if compare_like else 4
    if args.what == "compare" and (args.rounds < 1 or args.steps < 1):
        parser.error("--rounds and --steps must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    if args.what == "rank":
        rank(args)
        return
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work_dir or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        results = {
            "kernels": kernels,
            "builders": builders,
            "interleaved": interleaved,
            "profile": profile,
            "context-parallel": context_parallel,
            "compare": compare,
            "report": report,
            "speed-options": speed_options,
            "memory": memory,
            "lora": lora,
        }[args.what](args, work)
    text = json.dumps(results, indent=1)
    if args.what in ("compare", "report") and not args.json:
        print(compare_table(results))
    else:
        print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
