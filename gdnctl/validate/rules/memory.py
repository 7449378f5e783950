"""Memory fit of the trainer and the rollout weights on one GPU (estimate in gdnctl.memory)."""

from __future__ import annotations

from collections.abc import Iterator

from gdnctl.plan import Run, memory
from gdnctl.validate.findings import Issue, Severity, rule

WARN_USAGE = 0.9


@rule("MEM001", Severity.ERROR, "Trainer does not fit the GPU")
def trainer_fits(run: Run) -> Iterator[Issue]:
    """
    What it checks: the per-GPU training estimate (`gdnctl explain` prints the table: weights, gradients,
    optimizer, activations, logits, rl log-probs for rl jobs, overhead) against the GPU's memory: error above
    100%, warning above 90%.

    Why: an OOM surfaces only after the model loaded on every rank, minutes into the job. Two reported ones are in
    the table: the fp32 Adam state, which the optimizer allocates at its first step, so a job whose first forward
    and backward fit can still OOM at iteration 2 (reported for MoE jobs in Megatron-Bridge's Qwen3.5 campaign
    notes, which could not be found; the estimate counts the state from the start: 12 bytes per parameter over the
    distributed optimizer's shard, none when offloaded), and the fp32 logits of an rl micro-batch over Qwen3.5's
    248k vocabulary (micro_batch x rollout context x vocab / tp), which OOMed the log-prob pass of NVIDIA-NeMo/RL
    #2668 (fixed there by TP 2, halving the shard) and made NovaSky-AI/SkyRL #1610 chunk its log-probs.

    Source: NVIDIA-NeMo/RL #2668; NovaSky-AI/SkyRL #1610; Megatron-Bridge's Qwen3.5 campaign notes (iteration-2 OOM;
    cited, not found); gdnctl's estimate, gdnctl/plan/memory.py.

    Fix: raise ep/tp/pp/cp, turn on train.recompute: full, train.optimizer_cpu_offload: true, or lower
    train.seq_length (rl: rollout.max_model_len too).
    """
    if not run.is_training or run.gpu.sm is None or run.dp is None:
        return
    estimate = memory.estimate_training(run)
    biggest = max(estimate.rows, key=lambda row: row.gib)
    summary = (
        f"estimated {estimate.total_gib:.1f} GiB per GPU vs {estimate.capacity_gib:g} GiB on a "
        f"{run.gpu.description} ({estimate.usage:.0%}; largest: {biggest.name} {biggest.gib:.1f} GiB)"
    )
    fix = (
        "Raise ep/pp/cp, set train.recompute: full or train.optimizer_cpu_offload: true, or lower "
        "train.seq_length (gdnctl explain shows the table)."
    )
    yield from _fit("parallel", "the trainer", estimate, summary, fix)


@rule("MEM002", Severity.ERROR, "Rollout weights do not fit vLLM's memory share")
def rollout_weights_fit(run: Run) -> Iterator[Issue]:
    """
    What it checks: the bf16 weights on one rollout GPU (all parameters / rollout.tp) against
    rollout.gpu_memory_utilization x GPU memory: error when they exceed it, warning above 80% of it
    (little room left for the KV cache). With rollout.kv_cache_gib: the weights plus that KV cache against the
    GPU's memory (error above it).

    Why: vLLM fails at start-up ("No available memory for the cache blocks") after the trainer has loaded; with
    a fixed KV cache it allocates kv_cache_gib whatever gpu_memory_utilization says, and a GPU without that much
    room fails the allocation.

    Source: vLLM's start-up KV-cache allocation ("No available memory for the cache blocks"); gdnctl/plan/memory.py
    rollout_weights_gib (bf16 weights / rollout.tp); vllm/v1/worker/gpu_worker.py determine_available_memory
    returns kv_cache_memory_bytes unprofiled (vLLM 0.26.0).

    Fix: raise rollout.tp or rollout.gpu_memory_utilization; with kv_cache_gib, lower it or raise rollout.tp.
    """
    rollout = run.preset.rollout
    if run.preset.job != "rl" or rollout is None or run.gpu.sm is None:
        return
    if rollout.kv_cache_gib is not None:
        share = memory.rollout_share(run)
        if share.gib > run.gpu.memory_gib:
            yield Issue(
                "rollout.kv_cache_gib",
                f"vLLM cannot allocate its KV cache: {share.note} = {share.gib:.1f} GiB per rollout GPU "
                f"(tp={rollout.tp}) vs {run.gpu.memory_gib:g} GiB on a {run.gpu.description}.",
                "Lower rollout.kv_cache_gib or raise rollout.tp.",
            )
        return
    weights = memory.rollout_weights_gib(run)
    budget = rollout.gpu_memory_utilization * run.gpu.memory_gib
    text = (
        f"{weights:.1f} GiB of weights per rollout GPU (tp={rollout.tp}) vs {budget:.1f} GiB "
        f"(gpu_memory_utilization {rollout.gpu_memory_utilization} x {run.gpu.memory_gib:g} GiB)"
    )
    if weights > budget:
        yield Issue(
            "rollout.gpu_memory_utilization",
            f"vLLM cannot load the model: {text}.",
            "Raise rollout.tp or rollout.gpu_memory_utilization.",
        )
    elif weights > 0.8 * budget:
        yield Issue(
            "rollout.gpu_memory_utilization",
            f"little room is left for vLLM's KV cache: {text}.",
            "Raise rollout.tp or rollout.gpu_memory_utilization.",
            Severity.WARNING,
        )


@rule("MEM003", Severity.ERROR, "Colocated rollout does not fit beside the trainer's model")
def colocated_rollout_fits(run: Run) -> Iterator[Issue]:
    """
    What it checks: an rl job whose vLLM shares the trainer's GPUs, in the phase where vLLM is awake (`gdnctl
    explain` prints its table): the trainer's weights, gradients and optimizer state, which stay on the GPU
    while vLLM generates, plus vLLM's share (rollout.gpu_memory_utilization of the GPU, or its weights plus
    rollout.kv_cache_gib) and the overhead, against the GPU's memory: error above 100%, warning above 90%.

    Why: vLLM takes its share as a fraction of the whole GPU at start-up and its sleep mode re-allocates
    exactly that share on every wake-up (CuMemAllocator, vllm/device_allocator/cumem.py), so a share that leaves
    too little for the trainer's resident state fails at the first wake-up after the optimizer state exists,
    or at start-up, not before.

    With rollout.kv_cache_gib, vLLM holds its weights plus that cache but still refuses to start unless
    gpu_memory_utilization of the GPU is free, so that start is checked the same way.

    Source: vllm/v1/worker/gpu_worker.py sleep/wake_up and vllm/device_allocator/cumem.py; the start-up check is
    vllm/v1/worker/utils.py request_memory (vLLM 0.26.0).

    Fix: lower rollout.gpu_memory_utilization or rollout.kv_cache_gib (rollout.tp shards the weights it must
    hold), or shard the trainer further (ep/tp/pp, distributed optimizer, train.optimizer_cpu_offload: true).
    """
    estimate = memory.estimate_rollout_phase(run)
    rollout = run.preset.rollout
    if estimate is None or rollout is None:
        return
    summary = (
        f"while vLLM generates, the trainer's resident state and vLLM's share come to "
        f"{estimate.total_gib:.1f} GiB per GPU vs {estimate.capacity_gib:g} GiB ({estimate.usage:.0%})"
    )
    fixed_kv_cache = rollout.kv_cache_gib is not None
    share = "kv_cache_gib" if fixed_kv_cache else "gpu_memory_utilization"
    fix = (
        f"Lower rollout.{share}, or shard the trainer further (ep/tp/pp, "
        "train.optimizer_cpu_offload: true); gdnctl explain shows both phases."
    )
    yield from _fit(f"rollout.{share}", "the colocated rollout", estimate, summary, fix)
    if fixed_kv_cache:
        # With a fixed KV cache vLLM holds less than gpu_memory_utilization, but still wants that much free to start.
        startup = memory.estimate_rollout_phase(run, memory.rollout_startup_free(run))
        if startup is None:  # the same colocated rollout as above: always estimated
            return
        summary = (
            f"vLLM wants gpu_memory_utilization of the GPU free when it starts beside the trainer's "
            f"resident state: {startup.total_gib:.1f} GiB per GPU vs {startup.capacity_gib:g} GiB "
            f"({startup.usage:.0%})"
        )
        fix = (
            "Lower rollout.gpu_memory_utilization: with rollout.kv_cache_gib set it only sets what vLLM wants "
            "free at start-up."
        )
        yield from _fit("rollout.gpu_memory_utilization", "the colocated rollout's start", startup, summary, fix)


def _fit(path: str, subject: str, estimate, summary: str, fix: str):
    """An error above the GPU's memory, a warning above WARN_USAGE of it."""
    if estimate.usage > 1.0:
        yield Issue(path, f"{subject} does not fit: {summary}.", fix)
    elif estimate.usage > WARN_USAGE:
        yield Issue(path, f"{subject} barely fits: {summary}.", fix, Severity.WARNING)
