"""Run -> EngineConfig: the resolved run, with every decision of `gdnctl.plan.decisions`, as the engine config
the runtime reads. Nothing is decided here; values are only assembled.
"""

from __future__ import annotations

import math

from gdnctl import __version__
from gdnctl.knowledge import lora
from gdnctl.plan.explain import memory_table
from gdnctl.plan.memory import OVERHEAD_GIB
from gdnctl.plan.run import Run
from gdnctl.plan.speed import CUDA_GRAPH_WARMUP_STEPS, MANUAL_GC_INTERVAL, cuda_graph_modules
from gdnctl.schema import (
    DEFAULT_PROFILE_SUBDIR,
    EngineComm,
    EngineConfig,
    EngineDynamicSampling,
    EngineEnvironment,
    EngineEstimate,
    EngineEval,
    EngineGrpo,
    EngineImages,
    EngineKernels,
    EngineLora,
    EngineMetrics,
    EngineOverlong,
    EngineParallel,
    EngineRewardFunction,
    EngineRewardServer,
    EngineRollout,
    EngineSelftest,
    EngineSpeed,
    EngineTrain,
    EngineUserCode,
    RewardFunctionSpec,
    RewardServerSpec,
    RolloutSpec,
    parse_code_reference,
)


def _lora(run: Run) -> EngineLora | None:
    spec = run.preset.train.lora
    if spec is None:
        return None
    targets = run.lora_targets.value
    return EngineLora(
        rank=spec.rank,
        alpha=spec.alpha,
        dropout=spec.dropout,
        targets=list(targets),
        target_modules=lora.megatron_target_modules(targets),
        share_expert_adapters=run.lora_expert_adapters.value == "shared",
    )


def user_code(field: str, text: str) -> EngineUserCode:
    """The code a preset's field names (the loader made a file's path absolute)."""
    reference = parse_code_reference(text)
    return EngineUserCode(field=field, file=reference.file, module=reference.module, name=reference.name)


def _environment(rollout: RolloutSpec) -> EngineEnvironment | None:
    spec = rollout.environment
    if spec is None:
        return None
    return EngineEnvironment(code=user_code("rollout.environment.class", spec.class_), max_turns=spec.max_turns)


def _grpo(run: Run) -> EngineGrpo:
    grpo = run.preset.grpo
    reward: str | EngineRewardFunction | EngineRewardServer
    if isinstance(grpo.reward, RewardFunctionSpec):
        spec = grpo.reward
        reward = EngineRewardFunction(
            code=user_code("grpo.reward.function", spec.function),
            workers=grpo.reward_workers,
            timeout_s=spec.timeout_s,
            cpu_seconds=spec.cpu_seconds,
            memory_gib=spec.memory_gib,
            on_error=spec.on_error,
            default_score=spec.default_score,
        )
    elif isinstance(grpo.reward, RewardServerSpec):
        reward = EngineRewardServer(**grpo.reward.model_dump())
    else:
        reward = grpo.reward
    return EngineGrpo(
        reward=reward,
        **grpo.model_dump(exclude={"reward", "reward_workers", "rollout_correction", "dynamic_sampling", "overlong"}),
        rollout_correction=run.importance_weight.value,
        dynamic_sampling=None
        if grpo.dynamic_sampling is None
        else EngineDynamicSampling(**grpo.dynamic_sampling.model_dump()),
        overlong=None if grpo.overlong is None else EngineOverlong(**grpo.overlong.model_dump()),
    )


def engine_env(run: Run, kernel_cache_dir: str | None) -> dict[str, str]:
    values = {name: value for name, value, _ in run.environment}
    if kernel_cache_dir:
        values.update((name, value) for name, value, _ in run.kernel_cache_environment(kernel_cache_dir))
    values.update(run.preset.launch.env)
    return values


def compile_engine_config(run: Run, kernel_cache_dir: str | None = None) -> EngineConfig:
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
            engine=r.engine,
            tp=r.tp,
            num_gpus=run.rollout_gpus.value,
            colocate=r.colocate,
            gdn_prefill_backend=r.gdn_prefill_backend,
            gpu_memory_utilization=r.gpu_memory_utilization,
            kv_cache_gib=r.kv_cache_gib,
            max_model_len=r.max_model_len or t.seq_length,
            n_samples_per_prompt=r.n_samples_per_prompt,
            prompts_per_step=t.global_batch_size // r.n_samples_per_prompt,
            max_response_tokens=r.max_response_tokens,
            temperature=r.temperature,
            timeout_s=r.timeout_s,
            probe_tolerance=r.probe_tolerance,
            max_step0_logprob_gap=r.max_step0_logprob_gap or None,  # 0 and null both turn the check off
            python=r.python,
            enforce_eager=r.enforce_eager,
            weight_transport=run.rollout_weight_transport.value,
            weight_transport_reason=run.rollout_weight_transport.reason,
            sleep_between_phases=r.colocate and run.gpu.sm is not None,
            vision_language_class=run.rollout_class.value == "vision-language",
            overlong_prompts=r.overlong_prompts,
            max_staleness=r.max_staleness,
            partial=r.partial,
            max_engine_restarts=run.engine_restarts.value,
            engine_restarts_reason=run.engine_restarts.reason,
            stall_timeout_s=r.stall_timeout_s,
            environment=_environment(r),
        )
    return EngineConfig(
        gdnctl_version=__version__,
        name=preset.name,
        job=preset.job,
        device="cpu" if run.gpu.sm is None else "cuda",
        model=run.model,
        parallel=EngineParallel(
            nodes=preset.cluster.nodes,
            gpus_per_node=preset.cluster.gpus_per_node,
            world_size=run.world_size.value,
            tp=p.tp,
            pp=p.pp,
            cp=p.cp,
            ep=p.ep,
            etp=p.etp,
            vpp=p.vpp,
            dp=dp,
            sequence_parallel=run.sequence_parallel.value,
        ),
        layout=run.layout.value,
        packing=run.packing.value,
        train=EngineTrain(
            precision=t.precision,
            model_builder=run.model_builder.value,
            model_builder_reason=run.model_builder.reason,
            lora=_lora(run),
            micro_batch_size=t.micro_batch_size,
            global_batch_size=t.global_batch_size,
            seq_length=t.seq_length,
            num_microbatches=t.global_batch_size // (t.micro_batch_size * dp),
            lr=t.lr,
            lr_warmup_steps=run.lr_schedule["warmup_steps"].value,
            lr_decay=run.lr_schedule["decay"].value,
            min_lr=run.lr_schedule["min_lr"].value,
            train_iters=t.train_iters,
            seed=t.seed,
            recompute=t.recompute,
            optimizer_cpu_offload=t.optimizer_cpu_offload,
            distributed_optimizer=t.distributed_optimizer,
            data_path=t.data_path,
            tokenizer_path=preset.model.tokenizer or preset.model.path,
            save_dir=t.save_dir,
            save_interval=run.save_interval.value,
            skip_nonfinite_steps=t.skip_nonfinite_steps,
            images=EngineImages(**t.images.model_dump()) if t.images is not None else None,
            vision=t.vision,
        ),
        kernels=EngineKernels(
            gdn_backend=preset.kernels.gdn_backend,
            torch_compile=run.torch_compile.value,
            torch_compile_reason=run.torch_compile.reason,
            attention=run.attention.value,
            attention_reason=run.attention.reason,
        ),
        speed=_speed(run),
        comm=EngineComm(
            memory_guard=preset.comm.memory_guard,
            free_gb_threshold=preset.comm.free_gb_threshold,
            skip_ops=preset.comm.effective_skip_ops(),
            profile=preset.comm.profile,
            profile_dir=DEFAULT_PROFILE_SUBDIR,
        ),
        rollout=rollout,
        grpo=_grpo(run) if rollout is not None else None,
        eval=_eval(run),
        selftest=EngineSelftest(steps=preset.selftest.steps) if preset.job == "selftest" else None,
        metrics=EngineMetrics(
            peak_bf16_tflops=run.gpu.bf16_dense_tflops,
            wandb_project=preset.metrics.wandb.project if preset.metrics.wandb else None,
            wandb_entity=preset.metrics.wandb.entity if preset.metrics.wandb else None,
            wandb_mode=preset.metrics.wandb.mode if preset.metrics.wandb else None,
        ),
        estimate=_estimate(run),
        runtime_versions={k: v for k, v in run.stack.items() if v is not None},
        env=engine_env(run, kernel_cache_dir),
    )


def _eval(run: Run) -> EngineEval | None:
    """The held-out evaluation of a training job; rl's response length defaults to the rollout's."""
    spec, rollout = run.preset.eval, run.preset.rollout
    if spec is None or not run.is_training:
        return None
    default_tokens = rollout.max_response_tokens if rollout is not None else 1
    return EngineEval(
        data_path=spec.data_path,
        interval=spec.interval,
        samples_per_prompt=spec.samples_per_prompt,
        temperature=spec.temperature,
        max_response_tokens=spec.max_response_tokens or default_tokens,
        max_prompts=spec.max_prompts,
        batches=spec.batches,
    )


def _speed(run: Run) -> EngineSpeed:
    decided = run.speed
    values = {name: decision.value for name, decision in decided.items()}
    return EngineSpeed(
        **values,
        manual_gc_interval=MANUAL_GC_INTERVAL if values["manual_gc"] else 0,
        cuda_graph_warmup_steps=CUDA_GRAPH_WARMUP_STEPS if values["cuda_graphs"] else 0,
        cuda_graph_modules=cuda_graph_modules(run.preset, run.stack) if values["cuda_graphs"] else (),
        reasons={name: decision.reason for name, decision in decided.items()},
    )


def _estimate(run: Run) -> EngineEstimate:
    """explain's per-GPU total (rounded as explain prints it) and its flat overhead row; None where explain makes
    no estimate."""
    estimate = memory_table(run)
    if estimate is None or not math.isfinite(estimate.total_gib):
        return EngineEstimate(peak_memory_gib=None, overhead_gib=None)
    return EngineEstimate(peak_memory_gib=round(estimate.total_gib, 3), overhead_gib=OVERHEAD_GIB)
