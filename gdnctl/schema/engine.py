"""The engine config: what `gdnctl render` writes to `engine.yaml` and `python -m gdnctl.runtime` reads.

Every value here has been decided by the compiler (`gdnctl.compile`); the runtime never applies a default
of its own. Kept free of heavy imports: the runtime loads it before torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict

from gdnctl.knowledge import GdnBackendName, ModelArch

ENGINE_CONFIG_VERSION = 19  # 3: metrics (MFU peak, W&B); 4: estimate, rollout.max_step0_logprob_gap;
# 5: rollout weight transport, sleep between phases, served class; 6: the broadcast weight transport;
# 7: kernels.torch_compile; 8: the lr schedule, PPO mini-batches, eval, prompt checks; 9: packing;
# 10: speed.cuda_graphs, kernels.torch_compile decided by the plan (auto); 11: train.lora (what the trainer wraps);
# 12: packing concat, speed.cuda_graph_modules; 13: speed.overlap_grad_reduce; 14: speed.cutlass_grouped_gemm;
# 15: train.lora.share_expert_adapters; 16: grpo.reward as a function or a server, rollout.environment;
# 17: rollout.max_staleness, partial, max_engine_restarts (decided, with engine_restarts_reason) and
# stall_timeout_s, grpo.dynamic_sampling and overlong; 18: train.images and train.vision, model.vision;
# 19: train.images in rl jobs (the rollout serves the vision tower), grpo.reward digit_answer


class _Frozen(BaseModel):
    # defer_build: `gdnctl validate` never builds these; render and the runtime do, when they use them.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class EngineParallel(_Frozen):
    nodes: int
    gpus_per_node: int
    world_size: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    vpp: int | None
    dp: int
    sequence_parallel: bool


class EngineLora(_Frozen):
    """The LoRA adapters the trainer adds to the frozen base (runtime/model/lora_wrap.py)."""

    rank: int
    alpha: float
    dropout: float
    # The readable targets (knowledge/lora.py TARGETS) and the megatron-bridge LoRA target_modules they become.
    targets: list[str]
    target_modules: list[str]
    # megatron-bridge's LoRA(share_expert_adapters=...): one adapter for all of a layer's routed experts, or one each.
    share_expert_adapters: bool = False


class EngineImages(_Frozen):
    """train.images: the records may carry images, each within these limits (schema/image_data.py)."""

    max_per_sample: int
    max_bytes: int
    max_pixels: int


class EngineTrain(_Frozen):
    precision: str
    # Who builds the Megatron model (runtime/model/builders.py), and why (from the preset's runtime:).
    model_builder: Literal["megatron-bridge", "te-free"]
    model_builder_reason: str
    # None: every parameter trains.
    lora: EngineLora | None = None
    micro_batch_size: int
    global_batch_size: int
    seq_length: int
    num_microbatches: int
    lr: float
    # The lr schedule (runtime/train/lr_schedule.py, plan/decisions.lr_schedule): linear warmup over this many steps,
    # then cosine, linear or no decay to min_lr at train_iters. The defaults are a constant lr.
    lr_warmup_steps: int = 0
    lr_decay: Literal["cosine", "linear", "constant"] = "constant"
    min_lr: float = 0.0
    train_iters: int
    seed: int
    recompute: str
    optimizer_cpu_offload: bool
    distributed_optimizer: bool
    data_path: str | None
    tokenizer_path: str | None
    save_dir: str | None
    save_interval: int | None
    # Non-finite steps skipped before the job stops (runtime/train/nonfinite.py).
    skip_nonfinite_steps: int = 0
    # None: text only. With images, whether the vision tower trains or keeps its loaded weights.
    images: EngineImages | None = None
    vision: Literal["frozen", "train"] = "frozen"


class EngineComm(_Frozen):
    memory_guard: bool
    free_gb_threshold: float
    skip_ops: tuple[str, ...]
    profile: bool
    profile_dir: str


class EngineKernels(_Frozen):
    gdn_backend: GdnBackendName
    # False: the trainer process runs torch.compile'd functions eagerly (torch.compiler.set_stance("force_eager")).
    torch_compile: bool
    torch_compile_reason: str = ""  # why (plan/decisions.torch_compile)
    # The full-attention layers' core attention (plan/decisions.attention), and why.
    attention: Literal["te", "torch"] = "te"
    attention_reason: str = ""


class EngineSpeed(_Frozen):
    """The speed options as decided (plan/speed.py); the defaults are Megatron-Core's unfused paths."""

    router_fusion: bool = False
    bias_activation_fusion: bool = False
    rope_fusion: bool = False
    cross_entropy: Literal["te", "native"] = "native"
    wgrad_fusion: bool = False
    grad_reduce: Literal["bf16", "fp32"] = "fp32"
    manual_gc: bool = False
    manual_gc_interval: int = 0
    cuda_graphs: bool = False
    cuda_graph_warmup_steps: int = 0  # eager steps before the capture
    # megatron-core CudaGraphModule names the graphs cover (runtime/model/bridge.py), with cuda_graphs
    cuda_graph_modules: tuple[str, ...] = ()
    overlap_grad_reduce: bool = False
    # Transformer Engine reads it from NVTE_USE_CUTLASS_GROUPED_GEMM, which the launch scripts export (plan/speed.py)
    cutlass_grouped_gemm: bool = False
    # option -> why it has its value (the trainer logs them at start-up)
    reasons: dict[str, str] = {}


class EngineUserCode(_Frozen):
    """Code of the user's that the job runs (schema/user_code.py): a file's path or a module, and the name in it."""

    field: str  # the preset's field that names it, for messages
    file: str | None  # absolute path of a .py file
    module: str | None  # an importable module, when not a file
    name: str

    @property
    def text(self) -> str:
        return f"{self.file or self.module}:{self.name}"


class EngineEnvironment(_Frozen):
    """rollout.environment: the class whose instances run one multi-turn episode each (runtime/rl/environments)."""

    code: EngineUserCode
    max_turns: int


class EngineRollout(_Frozen):
    engine: str
    tp: int
    num_gpus: int
    colocate: bool
    gdn_prefill_backend: str | None
    gpu_memory_utilization: float
    # vLLM's KV cache per GPU in GiB (kv_cache_memory_bytes; no memory profiling); None: sized by profiling.
    kv_cache_gib: float | None
    max_model_len: int
    n_samples_per_prompt: int
    prompts_per_step: int
    max_response_tokens: int
    temperature: float
    timeout_s: float
    probe_tolerance: float
    # The first step's mean |log p| gap (trainer vs rollout, sampled tokens) above which a fresh run stops; None: off.
    max_step0_logprob_gap: float | None
    python: str | None
    enforce_eager: bool
    # How the weights reach vLLM after every step (plan/decisions.rollout_weight_transport), and why.
    weight_transport: Literal["cuda_ipc", "broadcast", "disk"]
    weight_transport_reason: str
    # Colocated on GPUs: vLLM sleeps (level 2, weights and KV cache freed) while the trainer steps.
    sleep_between_phases: bool
    # Qwen3.5 on vLLM < 0.27: served as the vision-language class, its vision tower not built.
    vision_language_class: bool
    # Prompts longer than max_model_len - max_response_tokens: left out (drop) or the job stops (refuse).
    overlong_prompts: Literal["drop", "refuse"] = "drop"
    # Off-policy with a bound (runtime/rl/feed.py): a trained sample lags the policy by at most this many weight
    # versions; 0 is the on-policy loop. partial: a weight update stops the requests in flight and continues them
    # under the new weights, re-prefilled (runtime/rl/rollout/server.py).
    max_staleness: int = 0
    partial: bool = False
    # Restarts of an engine that died or stopped making progress, over the whole job (runtime/rl/rollout/stream.py),
    # and the seconds without a token after which an engine with requests in flight counts as hung.
    max_engine_restarts: int = 0
    engine_restarts_reason: str = ""
    stall_timeout_s: float = 300.0
    # Multi-turn episodes with the user's environment; None: one model turn per prompt.
    environment: EngineEnvironment | None = None


class EngineDynamicSampling(_Frozen):
    max_rounds: int


class EngineOverlong(_Frozen):
    buffer_tokens: int
    penalty: float
    mask_truncated: bool


class EngineRewardFunction(_Frozen):
    """grpo.reward: {function: ...}, called in `workers` processes with these limits (runtime/rl/rewards/pool.py)."""

    kind: Literal["function"] = "function"
    code: EngineUserCode
    workers: int
    timeout_s: float
    cpu_seconds: float | None
    memory_gib: float | None
    on_error: Literal["stop", "default"]
    default_score: float


class EngineRewardServer(_Frozen):
    """grpo.reward: {url: ...} (runtime/rl/rewards/http_client.py)."""

    kind: Literal["server"] = "server"
    url: str
    timeout_s: float
    retries: int
    concurrency: int
    batch_size: int


class EngineGrpo(_Frozen):
    # A shipped reward's name (runtime/rl/rewards/shipped.py), the user's function, or a reward server.
    reward: str | EngineRewardFunction | EngineRewardServer
    clip_low: float
    clip_high: float
    kl_coef: float
    kl_kind: Literal["k1", "k2", "k3"]
    aggregation: Literal["token-mean", "seq-mean-token-mean"]
    normalize_std: bool
    # PPO: each rollout batch is trained over in `mini_batches` optimizer steps, `epochs` times, against the
    # log-probs of the policy that sampled it (runtime/rl/algorithm/updates.py).
    mini_batches: int = 1
    epochs: int = 1
    # Truncated importance sampling against the rollout's log-probs (runtime/rl/algorithm/grpo.py), capped at the cap.
    # Decided (plan/decisions.importance_weight): on when the preset asks, and always off-policy (the decoupled
    # objective's importance weight against the engine's log-probs).
    rollout_correction: bool = False
    rollout_correction_cap: float = 2.0
    # DAPO's dynamic sampling and over-long shaping (runtime/rl/algorithm/step_batch.py, sampling.py); None: off.
    dynamic_sampling: EngineDynamicSampling | None = None
    overlong: EngineOverlong | None = None


class EngineEval(_Frozen):
    """Held-out evaluation (runtime/rl/evaluation.py for rl, the Trainer's for sft and pretrain)."""

    data_path: str
    interval: int
    samples_per_prompt: int
    temperature: float
    max_response_tokens: int
    max_prompts: int | None
    batches: int


class EngineSelftest(_Frozen):
    steps: int


class EngineMetrics(_Frozen):
    # The GPU's dense bf16 peak (TFLOP/s) that MFU is reported against; None where gdnctl does not know it (CPU).
    peak_bf16_tflops: float | None
    wandb_project: str | None
    wandb_entity: str | None
    wandb_mode: Literal["online", "offline"] | None


class EngineEstimate(_Frozen):
    """What `gdnctl explain` expects the job to use, for the runtime to compare with what it measures (the first-
    minute check of every job and the smoke run)."""

    # Peak GPU memory (GiB) of the most loaded rank: explain's memory table; None where it has none (CPU, selftest).
    peak_memory_gib: float | None
    # The part of it outside PyTorch's allocator (CUDA context, NCCL buffers, allocator slack): the runtime measures
    # CUDA allocations, so it compares them with the total less this. None with peak_memory_gib.
    overhead_gib: float | None


class EngineConfig(_Frozen):
    version: int = ENGINE_CONFIG_VERSION
    gdnctl_version: str
    name: str
    job: Literal["rl", "sft", "pretrain", "selftest"]
    device: Literal["cuda", "cpu"]
    model: ModelArch
    parallel: EngineParallel
    layout: Literal["thd", "bshd"]
    # How documents become rows (runtime/data/pipeline.py): whole documents, cut to fill packed rows, or one
    # concatenated stream cut into full rows.
    packing: Literal["whole", "fill", "concat"] = "whole"
    train: EngineTrain
    kernels: EngineKernels
    speed: EngineSpeed = EngineSpeed()
    comm: EngineComm
    rollout: EngineRollout | None
    grpo: EngineGrpo | None
    eval: EngineEval | None = None
    selftest: EngineSelftest | None
    metrics: EngineMetrics
    estimate: EngineEstimate
    runtime_versions: dict[str, str]
    env: dict[str, str]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @classmethod
    def from_file(cls, path: str | Path) -> EngineConfig:
        data = yaml.safe_load(Path(path).read_text())
        return cls.model_validate(data)
