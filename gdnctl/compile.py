"""Preset -> EngineConfig. The only place a value the user left out is decided.

Each `decide` function returns the value together with the reason, so `gdnctl explain` can show why.
`compile_engine_config` assembles them into the engine config the runtime reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gdnctl import __version__, stack, versions
from gdnctl.engine_config import (
    EngineComm,
    EngineConfig,
    EngineKernels,
    EngineParallel,
    EngineGrpo,
    EngineRollout,
    EngineSelftest,
    EngineTrain,
)
from gdnctl.preset import Preset

if TYPE_CHECKING:
    from gdnctl.facts import Run


# Where TileLang's compiled FlashQLA kernels go when launch.kernel_cache_dir is unset: one cache per user, shared
# by every run and filled once by `gdnctl prewarm` (on clusters, put it on a shared filesystem).
DEFAULT_KERNEL_CACHE = "~/.cache/gdnctl/tilelang"


@dataclass(frozen=True)
class Decision:
    value: Any
    reason: str


def layout(preset: Preset, software: dict[str, str | None]) -> Decision:
    requested = preset.train.layout
    mcore = software.get("megatron_core")
    if requested != "auto":
        return Decision(requested, f"set in the preset (train.layout: {requested})")
    if versions.at_least(mcore, stack.MCORE_GDN_PACKED_AND_CP):
        return Decision("thd", f"megatron-core {mcore} supports packed (THD) sequences in GDN "
                               f"(since {stack.MCORE_GDN_PACKED_AND_CP}, PR #2645): no padding is computed")
    return Decision("bshd", f"megatron-core {mcore} GDN raises NotImplementedError on packed sequences "
                            f"(THD needs >= {stack.MCORE_GDN_PACKED_AND_CP}), so sequences are padded (BSHD)")


def sequence_parallel(preset: Preset) -> Decision:
    chosen = preset.parallel.sequence_parallel
    if chosen is not None:
        return Decision(chosen, "set in the preset (parallel.sequence_parallel)")
    if preset.parallel.tp > 1:
        return Decision(True, "tp > 1: sequence parallel shards norm/dropout activations over TP, and MoE "
                              "with TP requires it")
    return Decision(False, "tp == 1: sequence parallel has nothing to shard")


def rollout_gpus(preset: Preset, total_gpus: int) -> Decision:
    rollout = preset.rollout
    if preset.job != "rl" or rollout is None:
        return Decision(0, "no rollout: the job is not rl")
    if rollout.num_gpus is not None:
        return Decision(rollout.num_gpus, "set in the preset (rollout.num_gpus)")
    if rollout.colocate:
        return Decision(total_gpus, "colocated: vLLM uses every GPU and sleeps while the trainer steps")
    return Decision(total_gpus // 2, "not colocated and rollout.num_gpus unset: half of the GPUs")


def train_world_size(preset: Preset, total_gpus: int) -> Decision:
    rollout = preset.rollout
    if preset.job == "rl" and rollout is not None and not rollout.colocate:
        used = rollout_gpus(preset, total_gpus).value
        return Decision(total_gpus - used, f"{total_gpus} GPUs minus {used} for the separate rollout")
    return Decision(total_gpus, f"nodes x gpus_per_node = {total_gpus}")


def weight_sync_fallback_reasons(preset: Preset) -> tuple[str, ...]:
    """Why megatron-bridge's export cannot be used for trainer -> rollout weight sync (AReaL PR #1384)."""
    train = preset.train
    if not train.update_weights_via_bridge:
        return ()
    reasons = []
    if train.bridge != "megatron-bridge":
        reasons.append(f"train.bridge is {train.bridge}, and only megatron-bridge exports HF weights")
    if train.precision == "fp8":
        reasons.append("train.precision is fp8: quantized weights go through the registry conversion")
    if train.lora is not None:
        reasons.append("train.lora is set: LoRA adapters go through the registry conversion")
    return tuple(reasons)


def cuda_device_max_connections(run: "Run") -> Decision:
    p = run.preset.parallel
    if run.gpu.sm is None:
        return Decision(None, "no GPU")
    if run.gpu.is_blackwell:
        return Decision("32", "Blackwell: Megatron-Bridge's performance overrides use 32")
    if p.tp > 1 or p.cp > 1:
        return Decision("1", "TP or CP > 1 without comm overlap: Megatron needs kernels queued in issue order")
    return Decision(None, "TP == CP == 1: no ordering constraint, leave the driver default")


def environment(run: "Run") -> list[tuple[str, str, str]]:
    """(name, value, reason) for every variable the runtime needs, before the user's own `launch.env`."""
    env: list[tuple[str, str, str]] = []
    connections = cuda_device_max_connections(run)
    if connections.value is not None:
        env.append(("CUDA_DEVICE_MAX_CONNECTIONS", connections.value, connections.reason))
    if run.gpu.sm is not None:
        env.append(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True",
                    "fewer fragmentation OOMs with variable-length (packed) batches"))
        env.append(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", "a failed collective ends the job instead of hanging"))
    if run.preset.kernels.gdn_backend == "fla":
        env.append(("FLA_FLASH_QLA", "0", "FLA 0.6 silently dispatches to FlashQLA when it is importable; "
                                          "this keeps fla meaning FLA's own Triton kernels"))
    env.append(("OMP_NUM_THREADS", "1" if run.gpu.sm is not None else "2",
                "one CPU thread per rank unless told otherwise (torchrun would warn)"))
    return env


def engine_env(run: "Run", kernel_cache_dir: str | None) -> dict[str, str]:
    values = {name: value for name, value, _ in environment(run)}
    if kernel_cache_dir:
        values["TILELANG_CACHE_DIR"] = kernel_cache_dir
    values.update(run.preset.launch.env)
    return values


def compile_engine_config(run: "Run", kernel_cache_dir: str | None = None) -> EngineConfig:
    preset = run.preset
    p = preset.parallel
    t = preset.train
    dp = run.dp
    if dp is None:
        raise ValueError("compile_engine_config needs a run without errors (world size not divisible)")
    rollout = None
    if preset.job == "rl" and preset.rollout is not None:
        r = preset.rollout
        rollout = EngineRollout(
            engine=r.engine, tp=r.tp, num_gpus=run.rollout_gpus.value, colocate=r.colocate,
            gdn_prefill_backend=r.gdn_prefill_backend, gpu_memory_utilization=r.gpu_memory_utilization,
            max_model_len=r.max_model_len or t.seq_length, n_samples_per_prompt=r.n_samples_per_prompt,
            prompts_per_step=t.global_batch_size // r.n_samples_per_prompt,
            max_response_tokens=r.max_response_tokens, temperature=r.temperature, timeout_s=r.timeout_s,
            probe_tolerance=r.probe_tolerance,
            python=r.python,
        )
    return EngineConfig(
        gdnctl_version=__version__,
        name=preset.name,
        job=preset.job,
        device="cpu" if run.gpu.sm is None else "cuda",
        model=run.model,
        parallel=EngineParallel(
            nodes=preset.cluster.nodes, gpus_per_node=preset.cluster.gpus_per_node,
            world_size=run.world_size.value, tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep, etp=p.etp, vpp=p.vpp, dp=dp,
            sequence_parallel=run.sequence_parallel.value,
        ),
        layout=run.layout.value,
        train=EngineTrain(
            bridge=t.bridge, update_weights_via_bridge=t.update_weights_via_bridge,
            weight_sync_fallback_reasons=run.weight_sync_fallback_reasons, precision=t.precision,
            lora_rank=t.lora.rank if t.lora else None, lora_alpha=t.lora.alpha if t.lora else None,
            micro_batch_size=t.micro_batch_size, global_batch_size=t.global_batch_size,
            seq_length=t.seq_length, num_microbatches=t.global_batch_size // (t.micro_batch_size * dp),
            lr=t.lr, train_iters=t.train_iters, seed=t.seed, recompute=t.recompute,
            optimizer_cpu_offload=t.optimizer_cpu_offload, distributed_optimizer=t.distributed_optimizer,
            data_path=t.data_path,
            tokenizer_path=preset.model.tokenizer or preset.model.path, save_dir=t.save_dir,
            save_interval=t.save_interval,
        ),
        kernels=EngineKernels(gdn_backend=preset.kernels.gdn_backend),
        comm=EngineComm(
            memory_guard=preset.comm.memory_guard, free_gb_threshold=preset.comm.free_gb_threshold,
            skip_ops=preset.comm.effective_skip_ops(), profile=preset.comm.profile, profile_dir="comm_profile",
        ),
        rollout=rollout,
        grpo=EngineGrpo(**preset.grpo.model_dump()) if rollout is not None else None,
        selftest=EngineSelftest(steps=preset.selftest.steps) if preset.job == "selftest" else None,
        runtime_versions={k: v for k, v in run.stack.items() if v is not None},
        env=engine_env(run, kernel_cache_dir),
    )
