"""The preset schema: what a user writes. Field names here are the contract.

Presets are frozen and reject unknown keys. Values left out mean "let the compiler decide"
(`gdnctl.compile` is the only place a default is derived); the plain defaults below are the ones that need
no reasoning.
"""

from __future__ import annotations

import re
from types import UnionType
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from gdnctl.knowledge import (
    DEFAULT_GDN_BACKEND,
    DEFAULT_LORA_TARGETS,
    GPUS,
    LORA_TARGETS,
    GdnBackendName,
    LoraTargetName,
    versions,
)
from gdnctl.schema import comm_ops
from gdnctl.schema.user_code import parse_code_reference

JobKind = Literal["rl", "sft", "pretrain", "selftest"]
# Both patterns are used with `fullmatch`: `$` with `match` would let a trailing newline through.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What may stand in an #SBATCH directive: sbatch reads those lines itself (no shell quoting applies), so
# spaces, quotes, `$` and newlines are refused rather than escaped.
SBATCH_SAFE = re.compile(r"[A-Za-z0-9_.,:@%+=/&|!*\[\]\-]+")
SBATCH_SAFE_TEXT = "use letters, digits and _ . , : @ % + = / & | ! * [ ] - only (no spaces, quotes, $ or newlines)"


# Upper bounds of the sizes a preset gives. Each is far past any real job and keeps every product the planner
# forms (tokens x vocab, GPUs x parallel sizes) a finite float: a preset cannot make the estimate overflow.
MAX_NODES = 100_000  # more nodes than any GPU cluster has
MAX_PER_NODE = 1_024  # GPUs (or CPU processes) on one host
MAX_GPUS = MAX_NODES * MAX_PER_NODE  # no parallel group or rollout is larger than the cluster
MAX_TOKENS = 2**24  # 16M tokens: 16x the longest Qwen3.5 context (262,144 native, about 1M with YaRN)
MAX_SEQUENCES = 2**24  # sequences in one batch
MAX_STEPS = 10**9  # training steps
MAX_CPUS = 65_536  # CPUs on one host
MAX_LORA_RANK = 65_536  # past every hidden size: a LoRA rank cannot exceed the width it adapts
MAX_SEED = 2**63 - 1  # torch.manual_seed takes < 2**64; Megatron adds small per-rank offsets to the seed
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: no rollout request legitimately takes longer
MAX_GPU_MEMORY_GIB = 4_096.0  # 4 TiB: past any one accelerator's memory (MEM002 checks the preset's GPU)
MAX_STALENESS = 1_000  # weight versions a sample may lag: past any useful off-policy bound
MAX_ENGINE_RESTARTS = 1_000
MAX_SAMPLING_ROUNDS = 1_000
MAX_HOST_MEMORY_GIB = 65_536.0  # 64 TiB: past any one host's memory
MAX_WORKERS = 4_096  # processes or connections a reward keeps busy at once
MAX_TURNS = 1_000  # model turns in one episode


def _number_as_text(value: object, kinds: type | UnionType) -> object:
    """A YAML number where a text field expects one (`mem: 0`, `CUDA_DEVICE_MAX_CONNECTIONS: 1`) as YAML spelled it;
    bools are not numbers here."""
    return str(value) if isinstance(value, kinds) and not isinstance(value, bool) else value


class _Section(BaseModel):
    # defer_build: the schema is built once, for Preset, at the first validation instead of per section.
    # allow_inf_nan=False: no field means anything at NaN or infinity, and the planner would compute with them.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: object) -> object:
        """A NUL byte ends a C string: paths, environment values and script lines cannot hold one."""
        if isinstance(value, dict):
            value_texts = list(value.values())
        else:
            value_texts = value if isinstance(value, list) else [value]
        if any(isinstance(text, str) and "\0" in text for text in value_texts):
            raise ValueError("a NUL byte (\\0) cannot be part of a preset value")
        return value


class ModelSpec(_Section):
    id: str | None = Field(None, description="Catalog id, e.g. Qwen/Qwen3.5-35B-A3B (`gdnctl presets` lists them)")
    path: str | None = Field(None, description="Local checkpoint dir; its config.json wins over the catalog")
    tokenizer: str | None = Field(None, description="Tokenizer dir (default: model.path)")

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if self.id is None and self.path is None:
            raise ValueError("set model.id (a catalog id) or model.path (a checkpoint dir with config.json)")
        return self


class ClusterSpec(_Section):
    nodes: int = Field(1, ge=1, le=MAX_NODES, description=f"at most {MAX_NODES:,}")
    gpus_per_node: int = Field(
        8,
        ge=1,
        le=MAX_PER_NODE,
        description=f"GPUs per node (processes per node when gpu is cpu), at most {MAX_PER_NODE:,}",
    )
    gpu: str = Field("h100", description="GPU kind: " + ", ".join(GPUS))

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        value = value.lower()
        if value not in GPUS:
            import difflib

            close = difflib.get_close_matches(value, list(GPUS), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ValueError(f"unknown GPU '{value}': {hint}known: {', '.join(GPUS)}")
        return value


class ParallelSpec(_Section):
    tp: int = Field(1, ge=1, le=MAX_GPUS, description=f"tensor parallel size, at most {MAX_GPUS:,} (all GPUs)")
    pp: int = Field(1, ge=1, le=MAX_GPUS, description=f"pipeline parallel size, at most {MAX_GPUS:,}")
    cp: int = Field(1, ge=1, le=MAX_GPUS, description=f"context parallel size, at most {MAX_GPUS:,}")
    ep: int = Field(1, ge=1, le=MAX_GPUS, description=f"expert parallel size, at most {MAX_GPUS:,}")
    etp: int = Field(1, ge=1, le=MAX_GPUS, description=f"expert tensor parallel size, at most {MAX_GPUS:,}")
    vpp: int | None = Field(
        None, ge=1, le=MAX_GPUS, description=f"virtual pipeline stages per pipeline rank (at most {MAX_GPUS:,})"
    )
    sequence_parallel: bool | None = Field(None, description="default: on when tp > 1")


class LoraSpec(_Section):
    """LoRA adapters on a frozen base (gdnctl/knowledge/lora.py: what each target wraps, and where that was read)."""

    rank: int = Field(ge=1, le=MAX_LORA_RANK, description=f"at most {MAX_LORA_RANK:,}")
    alpha: float = Field(gt=0, description="the adapters' output is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input (megatron-bridge's default 0)")
    targets: list[LoraTargetName] | None = Field(
        None,
        min_length=1,
        description="which linears get adapters: " + ", ".join(LORA_TARGETS) + "; default: those megatron-bridge's "
        "Qwen3.5 LoRA recipes cover that the model has (" + ", ".join(DEFAULT_LORA_TARGETS) + ")",
    )
    expert_adapters: Literal["auto", "per_expert", "shared"] = Field(
        "auto",
        description="the routed experts' adapters (targets with experts): shared, one for all of a layer's "
        "experts (megatron-bridge's own default: fewer parameters and no per-expert work in the step; with "
        "parallel.ep 1), saved as identical per-expert copies; per_expert, one for each expert; auto: shared "
        "with parallel.ep 1, per_expert with more",
    )

    @field_validator("targets")
    @classmethod
    def _distinct(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("each target may appear once in train.lora.targets")
        return value


MAX_IMAGES_PER_SAMPLE = 1_024
MAX_IMAGE_BYTES = 2**30  # 1 GiB: past any one image a training record holds
MAX_IMAGE_PIXELS = 2**31 - 1


class ImagesSpec(_Section):
    """The job's records carry images (docs/images.md); the limits validate and the job's start hold every image to."""

    max_per_sample: int = Field(
        1,
        ge=1,
        le=MAX_IMAGES_PER_SAMPLE,
        description=f"images one record may hold, at most {MAX_IMAGES_PER_SAMPLE:,}",
    )
    max_bytes: int = Field(
        16 * 2**20,
        ge=1,
        le=MAX_IMAGE_BYTES,
        description="bytes of one image file or inline image (16 MiB by default, at most 1 GiB)",
    )
    max_pixels: int = Field(
        4096 * 4096,
        ge=1,
        le=MAX_IMAGE_PIXELS,
        description="width x height of one image as stored (before the processor resizes it); 4096 x 4096 by default",
    )


class TrainSpec(_Section):
    precision: Literal["bf16", "fp8"] = "bf16"
    lora: LoraSpec | None = None
    layout: Literal["auto", "thd", "bshd"] = "auto"
    packing: Literal["auto", "whole", "fill", "concat"] = Field(
        "auto",
        description="how documents become rows: whole (each document in one packed row, a longer one truncated), "
        "fill (documents cut at row ends into packed rows, each piece attending only to itself) or concat "
        "(documents joined end to end and cut into full rows of seq_length tokens, attention and the GDN state "
        "running across document ends: Megatron's pretraining default); auto: concat for pretrain, whole "
        "otherwise",
    )
    micro_batch_size: int = Field(1, ge=1, le=MAX_SEQUENCES, description=f"at most {MAX_SEQUENCES:,}")
    global_batch_size: int = Field(128, ge=1, le=MAX_SEQUENCES, description=f"at most {MAX_SEQUENCES:,}")
    seq_length: int = Field(
        4096, ge=1, le=MAX_TOKENS, description=f"tokens, at most {MAX_TOKENS:,} (16x the longest Qwen3.5 context)"
    )
    mtp: bool = Field(False, description="train the multi-token-prediction layer")
    recompute: Literal["none", "selective", "full"] = "none"
    distributed_optimizer: bool = True
    optimizer_cpu_offload: bool = False
    lr: float = Field(1e-6, gt=0, description="peak learning rate, reached at the end of the warmup")
    lr_warmup_steps: int | None = Field(
        None,
        ge=0,
        le=MAX_STEPS,
        description="optimizer steps (rl: rollout steps) the lr rises linearly over, from "
        "lr / lr_warmup_steps to lr; default: a tenth of train_iters, at most "
        "1,000 (`gdnctl explain` says what it picked)",
    )
    lr_decay: Literal["cosine", "linear", "constant"] | None = Field(
        None,
        description="how the lr falls from lr to min_lr after the warmup, reaching it at train_iters; default: "
        "cosine for sft and pretrain, constant for rl",
    )
    min_lr: float | None = Field(
        None, ge=0, description="the lr at the end of a cosine or linear decay; default: lr / 10"
    )
    train_iters: int = Field(100, ge=1, le=MAX_STEPS, description=f"at most {MAX_STEPS:,}")
    seed: int = Field(
        1234,
        ge=0,
        le=MAX_SEED,
        description="0 to 2**63 - 1 (torch.manual_seed's range, with room for Megatron's per-rank offsets)",
    )
    data_path: str | None = Field(None, description="local jsonl/parquet; synthetic tokens when unset")
    save_dir: str | None = None
    save_interval: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="save every this many steps (and after the last); default with a save_dir: a tenth of "
        f"train_iters, so a failure loses at most a tenth of the run (`gdnctl explain` says; at most {MAX_STEPS:,})",
    )
    images: ImagesSpec | None = Field(
        None,
        description="the records of train.data_path and eval.data_path may carry images, within these limits; null: "
        "text only",
    )
    vision: Literal["frozen", "train"] = Field(
        "frozen",
        description="with images: frozen keeps the vision tower's weights as loaded (saves carry them over "
        "unchanged), train trains it with the language model",
    )
    skip_nonfinite_steps: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="steps whose loss or gradient is not finite that the job may skip (not apply) before it stops; 0 "
        "stops at the first: in bf16 there is no loss scale to back off, so a non-finite step means bad "
        "data, a divergence or a kernel bug, and skipping hides which",
    )


class KernelsSpec(_Section):
    gdn_backend: GdnBackendName = DEFAULT_GDN_BACKEND
    torch_compile: Literal["auto"] | bool = Field(
        "auto",
        description="torch.compile the trainer's fused elementwise functions (Megatron-Core's, Transformer "
        "Engine's, FLA's); false runs them eagerly. auto: on where sft or pretrain trains on the "
        "Transformer Engine builder with one row shape every step (filled or padded rows), "
        "off elsewhere (`gdnctl explain` says why)",
    )
    attention: Literal["auto", "te", "torch"] = Field(
        "auto",
        description="the full-attention layers' core attention: te (Transformer Engine's), torch (SDPA and "
        "varlen FlashAttention) or auto (`gdnctl explain` says which and why)",
    )


_AUTO_ON_OFF = Literal["auto", "on", "off"]


class SpeedSpec(_Section):
    """How a training step is computed, not what it computes; `gdnctl explain` says what `auto` picks and why."""

    router_fusion: _AUTO_ON_OFF = Field("auto", description="Transformer Engine's fused MoE router kernel")
    bias_activation_fusion: _AUTO_ON_OFF = Field("auto", description="the experts' SwiGLU as one fused function")
    rope_fusion: _AUTO_ON_OFF = Field("auto", description="Transformer Engine's fused rotary embedding")
    cross_entropy: Literal["auto", "te", "native"] = Field(
        "auto", description="te: Transformer Engine's cross entropy on the logits; native: Megatron-Core's"
    )
    wgrad_fusion: _AUTO_ON_OFF = Field(
        "auto", description="Transformer Engine's layers add weight gradients straight into the gradient buffer"
    )
    grad_reduce: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="dtype gradients are accumulated and reduced in (auto: bf16, fp32 for rl)"
    )
    manual_gc: _AUTO_ON_OFF = Field(
        "auto", description="Python's garbage collector runs between steps, not in the middle of one"
    )
    cuda_graphs: _AUTO_ON_OFF = Field(
        "auto",
        description="Transformer Engine CUDA graphs of each MoE layer's router and dispatch preprocessing, and of "
        "each layer's attention or GDN block on rows without packed-sequence offsets (needs one row shape every "
        "step: concatenated or filled rows, or padded rows)",
    )
    overlap_grad_reduce: _AUTO_ON_OFF = Field(
        "auto",
        description="with data parallel, each bucket of gradients is reduced across the ranks while the backward pass "
        "goes on, instead of all of them after it",
    )
    cutlass_grouped_gemm: _AUTO_ON_OFF = Field(
        "auto",
        description="the MoE experts' grouped GEMMs through Transformer Engine's CUTLASS kernel instead of cuBLAS "
        "(NVTE_USE_CUTLASS_GROUPED_GEMM; Hopper, bf16)",
    )

    @field_validator(
        "router_fusion",
        "bias_activation_fusion",
        "rope_fusion",
        "wgrad_fusion",
        "manual_gc",
        "cuda_graphs",
        "overlap_grad_reduce",
        "cutlass_grouped_gemm",
        mode="before",
    )
    @classmethod
    def _yaml_switch(cls, value: object) -> object:
        """YAML 1.1 reads a bare `on`/`off` as true/false: take them as the switch they spell."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class CommSpec(_Section):
    memory_guard: bool = Field(True, description="check free GPU memory before collectives (slime's guard)")
    free_gb_threshold: float = Field(3.0, ge=0, description="below this many free GiB the guard empties the cache")
    skip_ops: list[str] | None = Field(None, description="ops never checked; default: the 8 ops of slime PR #1947")
    add_skip_ops: list[str] = Field(default_factory=list, description="added to skip_ops (or the default set)")
    remove_skip_ops: list[str] = Field(default_factory=list, description="removed from skip_ops")
    profile: bool = Field(False, description="record per-op memory signals per rank (gdnctl comm-report)")

    def effective_skip_ops(self) -> tuple[str, ...]:
        base = comm_ops.DEFAULT_SKIP_OPS if self.skip_ops is None else tuple(self.skip_ops)
        ops = [op for op in base if op not in self.remove_skip_ops]
        ops += [op for op in self.add_skip_ops if op not in ops]
        return tuple(ops)


def _code_reference(value: str) -> str:
    parse_code_reference(value)  # raises the sentence
    return value


class EnvironmentSpec(_Section):
    """A multi-turn environment of the user's (runtime/rl/environments/contract.py): it starts each episode from a
    dataset record and answers every model turn with observations or the episode's reward."""

    class_: str = Field(
        alias="class",
        description='"path/to/env.py:Env" (relative to this preset) or "package.module:Env": the class whose '
        "instances run one episode each",
    )
    max_turns: int = Field(4, ge=1, le=MAX_TURNS, description=f"model turns in one episode, at most {MAX_TURNS:,}")

    _reference = field_validator("class_")(_code_reference)


class RolloutSpec(_Section):
    engine: Literal["vllm"] = "vllm"
    tp: int = Field(1, ge=1, le=MAX_GPUS, description=f"vLLM tensor parallel size per engine, at most {MAX_GPUS:,}")
    num_gpus: int | None = Field(
        None, ge=1, le=MAX_GPUS, description=f"rollout GPUs; default: all when colocated (at most {MAX_GPUS:,})"
    )
    colocate: bool = Field(True, description="trainer and rollout share GPUs, offloading between phases")
    gdn_prefill_backend: str | None = Field(None, description="vLLM --gdn-prefill-backend; null emits no flag")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    kv_cache_gib: float | None = Field(
        None,
        gt=0,
        le=MAX_GPU_MEMORY_GIB,
        description="vLLM's KV cache per GPU in GiB (its kv_cache_memory_bytes): a fixed size instead of what "
        "memory profiling leaves of gpu_memory_utilization. vLLM then skips the profiling, which "
        "fails when another process on the GPU frees memory meanwhile; it still wants "
        "gpu_memory_utilization of the GPU free at start-up. null: profile",
    )
    max_model_len: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description=f"default: train.seq_length (at most {MAX_TOKENS:,})"
    )
    n_samples_per_prompt: int = Field(8, ge=1, le=MAX_SEQUENCES, description=f"at most {MAX_SEQUENCES:,}")
    python: str | None = Field(None, description="interpreter of the rollout's own environment")
    enforce_eager: bool = Field(
        False,
        description="vLLM without CUDA graphs or torch.compile on GPUs: starts in "
        "about a minute instead of several, generates slower",
    )
    weight_sync: Literal["auto", "cuda_ipc", "broadcast", "disk"] = Field(
        "auto",
        description="how the trainer hands the rollout its weights after every step: cuda_ipc (GPU memory "
        "shared in buckets, colocated on GPUs), broadcast (trainer rank 0 sends buckets to "
        "every vLLM worker over NCCL, or gloo on CPU; separate placement), disk (a safetensors "
        "directory in the run dir), auto (cuda_ipc colocated and broadcast separate on GPUs, "
        "where they can run; else disk)",
    )
    container_image: str | None = Field(None, description="container image for the rollout step (Slurm)")
    max_response_tokens: int = Field(
        1024, ge=1, le=MAX_TOKENS, description=f"longest response sampled per prompt (at most {MAX_TOKENS:,})"
    )
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    timeout_s: float = Field(
        600.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="seconds a rollout server may take to start, to take a weight sync or to answer the held-out "
        "evaluation's batch before it is declared hung and the job fails (at most a week); the samples' "
        "generation has a deadline of its own, stall_timeout_s",
    )
    probe_tolerance: float = Field(
        0.1,
        gt=0,
        description="largest mean |log p| gap (nats/token) between trainer and rollout on the weight-sync probe",
    )
    # 0.05 nats/token. Healthy pairs stay well under it: measured 0.0013-0.0023 between the CPU policy (fp32) and
    # vLLM's CPU build (bf16); bf16 trainers and rollouts on GPUs sit near a mismatch KL of 1e-3 (sail-sg/
    # Precision-RL), i.e. a root-mean-square gap of sqrt(2 x 1e-3) = 0.045, which bounds the mean |gap|. Broken
    # ones go past it: a rollout on weights that did not arrive measures 0.18-0.4 (weight_sync), and prime-rl #2671's
    # step-0 mismatch KL of 0.03 on Qwen3.5-4B, called too large there, is a root-mean-square gap of 0.25.
    overlong_prompts: Literal["drop", "refuse"] = Field(
        "drop",
        description="prompts longer than max_model_len - max_response_tokens, found when every prompt is "
        "encoded before step 1: drop leaves them out and names their count and first lines; "
        "refuse stops the job before step 1",
    )
    environment: EnvironmentSpec | None = Field(
        None,
        description="multi-turn episodes with an environment of yours (tools, feedback); null: one model turn "
        "per prompt, scored by grpo.reward",
    )
    max_step0_logprob_gap: float | None = Field(
        0.05,
        ge=0,
        description="largest mean |log p| gap (nats/token) between trainer and rollout on the sampled "
        "tokens of a fresh run's first step; above it the rl job stops at step 0, before "
        "anything is saved (weights not synced, dtype or kernel mismatch). 0 or null: off",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=MAX_STALENESS,
        description="how many weight versions a trained sample may lag the policy it trains (off-policy "
        "with a bound): with N >= 1 the rollout of the next N steps runs while the trainer trains, on "
        "engines of their own (rollout.colocate: false). 0: on-policy, each step's rollout waits for the "
        f"step before it (at most {MAX_STALENESS})",
    )
    partial: bool = Field(
        False,
        description="partial rollouts: a weight update stops the engines' requests in flight and continues "
        "them under the new weights (re-prefilled: a GDN request never resumes on state computed under "
        "the old weights), instead of waiting for the longest response; needs max_staleness >= 1",
    )
    max_engine_restarts: int = Field(
        2,
        ge=0,
        le=MAX_ENGINE_RESTARTS,
        description="times over the whole job a rollout engine that dies or stops making progress is "
        "restarted (its requests sent again) before the job fails; 0: the first failure ends the job "
        f"(at most {MAX_ENGINE_RESTARTS})",
    )
    stall_timeout_s: float = Field(
        300.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="seconds an engine with requests in flight may go without producing a token (or without "
        "answering) before it is declared hung, stopped and restarted; each request's own deadline, not "
        "a whole rollout's (rollout.timeout_s still bounds start-up and weight syncs)",
    )


class DynamicSamplingSpec(_Section):
    """DAPO's dynamic sampling (runtime/rl/algorithm/step_batch.py)."""

    max_rounds: int = Field(
        3,
        ge=1,
        le=MAX_SAMPLING_ROUNDS,
        description="generation rounds per step at most, the step's own prompts being the first; what is "
        "still missing after the last is filled with dropped groups that take no loss "
        f"(at most {MAX_SAMPLING_ROUNDS})",
    )


class OverlongSpec(_Section):
    """DAPO's over-long reward shaping (runtime/rl/algorithm/sampling.py overlong_penalty)."""

    buffer_tokens: int = Field(
        ge=1,
        le=MAX_TOKENS,
        description="the last this many tokens before rollout.max_response_tokens, over which the penalty "
        "grows linearly from 0 to penalty",
    )
    penalty: float = Field(1.0, ge=0, le=1e6, description="what a response of max_response_tokens loses")
    mask_truncated: bool = Field(
        False,
        description="responses cut at rollout.max_response_tokens (finish reason length) take no loss "
        "(DAPO's overlong filtering)",
    )


# The shipped rule-based rewards (runtime/rl/rewards/shipped.py holds them, one entry each).
ShippedReward = Literal["math_exact", "digit_fraction", "digit_answer"]


class RewardFunctionSpec(_Section):
    """A reward function of the user's, called once per sample in a pool of worker processes
    (runtime/rl/rewards/pool.py) as score(prompt=..., response=..., response_ids=..., record=...)."""

    function: str = Field(
        description='"path/to/rewards.py:score" (relative to this preset) or "package.module:score"',
    )
    timeout_s: float = Field(
        60.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="seconds one call may take; past them the worker is killed, replaced and the call failed",
    )
    cpu_seconds: float | None = Field(
        60.0, gt=0, le=MAX_TIMEOUT_S, description="CPU seconds one call may use (RLIMIT_CPU); null: no limit"
    )
    memory_gib: float | None = Field(
        4.0,
        gt=0,
        le=MAX_HOST_MEMORY_GIB,
        description="address space of each worker process in GiB (RLIMIT_AS: virtual memory, so the "
        "libraries the function imports count); null: no limit",
    )
    on_error: Literal["stop", "default"] = Field(
        "stop",
        description="a call that raises, times out, passes a limit or returns a non-finite score: stop the job "
        "with a sentence naming the sample and the function, or give the sample default_score, count it "
        "in the step's reward_failures and log it with the sample",
    )
    default_score: float = Field(0.0, description="the score a failed call gives its sample (on_error: default)")

    _reference = field_validator("function")(_code_reference)

    @model_validator(mode="after")
    def _default_needs_default(self) -> RewardFunctionSpec:
        if "default_score" in self.model_fields_set and self.on_error != "default":
            raise ValueError("a default_score applies with on_error: default only; set on_error: default or remove it")
        return self


class RewardServerSpec(_Section):
    """A reward server of the user's: batches of samples POSTed as JSON (runtime/rl/rewards/http_client.py has the
    request and the response), with retries and backoff."""

    url: str = Field(description="http://HOST:PORT/PATH (or https://) that answers the batch requests")
    timeout_s: float = Field(
        60.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="the connection's timeout in seconds: to connect, and to wait for the answer or its next bytes",
    )
    retries: int = Field(
        3,
        ge=0,
        le=100,
        description="attempts after the first for a request that fails to connect, times out "
        "or is answered 429 or 5xx, with exponential backoff",
    )
    concurrency: int = Field(4, ge=1, le=MAX_WORKERS, description="requests in flight at once")
    batch_size: int = Field(32, ge=1, le=MAX_SEQUENCES, description="most samples in one request")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.isprintable() or " " in value:
            raise ValueError("the url must be one line without spaces")
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"'{value}' is not an http:// or https:// url with a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("a user or password in the url would be written into the run dir; leave them out")
        try:
            parts.port  # noqa: B018 - a port out of range or not a number raises here
        except ValueError as error:
            raise ValueError(f"the url's port is not valid ({error})") from None
        return value


# The tags pydantic puts into an error's location for grpo.reward's three forms; the loader leaves them out of
# the field path it reports.
REWARD_TAGS = ("shipped reward", "reward function", "reward server")


def _reward_form(value: Any) -> str | None:
    if isinstance(value, str):
        return REWARD_TAGS[0]
    if isinstance(value, RewardServerSpec) or (isinstance(value, dict) and "url" in value):
        return REWARD_TAGS[2]
    if isinstance(value, (RewardFunctionSpec, dict)):
        return REWARD_TAGS[1]
    return None


RewardSetting = Annotated[
    Annotated[ShippedReward, Tag(REWARD_TAGS[0])]
    | Annotated[RewardFunctionSpec, Tag(REWARD_TAGS[1])]
    | Annotated[RewardServerSpec, Tag(REWARD_TAGS[2])],
    Discriminator(
        _reward_form,
        custom_error_type="reward_form",
        custom_error_message="the reward is a shipped reward's name (math_exact, digit_fraction, digit_answer), "
        "{function: 'file.py:name'} or {url: 'http://host:port/path'}",
    ),
]


class GrpoSpec(_Section):
    """The rl job's objective: GRPO with group-normalised outcome rewards and a clipped policy loss."""

    reward: RewardSetting = Field(
        "math_exact",
        description="a shipped rule-based reward (math_exact, digit_fraction, digit_answer), a function of yours "
        "({function: ...}) or a reward server ({url: ...}); docs/rl.md says how to write each",
    )
    reward_workers: int = Field(
        4,
        ge=1,
        le=MAX_WORKERS,
        description="worker processes that call grpo.reward.function, each on one sample (a function's only)",
    )
    clip_low: float = Field(0.2, ge=0, lt=1, description="lower ratio clip (1 - clip_low)")
    clip_high: float = Field(
        0.2, ge=0, description="upper ratio clip (1 + clip_high); > clip_low is DAPO's clip-higher"
    )
    kl_coef: float = Field(0.0, ge=0, description="weight of the KL to the starting policy (0: no reference)")
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    aggregation: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    normalize_std: bool = Field(True, description="divide advantages by the group's std (false: Dr. GRPO)")
    mini_batches: int = Field(
        1,
        ge=1,
        le=MAX_SEQUENCES,
        description="optimizer steps per pass over a rollout batch: its samples split "
        "into this many mini-batches (PPO's); from the second on, the policy "
        "has moved away from the one that sampled, so the ratio clip acts. "
        "train.global_batch_size must split evenly into them over the "
        "data-parallel ranks",
    )
    epochs: int = Field(
        1,
        ge=1,
        le=1000,
        description="passes over each rollout batch (PPO epochs); every pass takes mini_batches optimizer steps",
    )
    rollout_correction: bool = Field(
        False,
        description="truncated importance sampling against the rollout's log-probs (slime's and verl's TIS): "
        "each token's loss is weighted by min(p_trainer / p_rollout, rollout_correction_cap), "
        "correcting for the rollout engine's numerics differing from the trainer's",
    )
    rollout_correction_cap: float = Field(
        2.0, ge=1, description="the largest weight rollout_correction gives a token (slime's --tis-clip default)"
    )
    dynamic_sampling: DynamicSamplingSpec | None = Field(
        None,
        description="DAPO's dynamic sampling: groups whose rewards are all equal (no advantage to learn "
        "from) are dropped, and further prompts are drawn until the batch is full or max_rounds "
        "generation rounds have run; null: every group is trained",
    )
    overlong: OverlongSpec | None = Field(
        None,
        description="DAPO's over-long reward shaping: a soft penalty over the last buffer_tokens before "
        "rollout.max_response_tokens, and optionally no loss on truncated responses; null: off",
    )


class EvalSpec(_Section):
    """Held-out evaluation during a run: rl samples held-out prompts and logs their mean reward and pass@k
    (`eval_reward` rows); sft and pretrain log the held-out loss (`eval_loss` rows). Both reach metrics.jsonl,
    TensorBoard and W&B."""

    data_path: str = Field(
        description="held-out data in the training data's format: rl, a prompt jsonl "
        '({"prompt", "answer"} a line); sft and pretrain, documents like '
        "train.data_path"
    )
    interval: int = Field(
        10, ge=1, le=MAX_STEPS, description="evaluate after every this many steps (and after the last)"
    )
    samples_per_prompt: int = Field(
        4, ge=1, le=MAX_SEQUENCES, description="rl: responses per held-out prompt; pass@k takes k = this"
    )
    temperature: float = Field(1.0, gt=0, description="rl: the held-out responses' sampling temperature")
    max_response_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="rl: longest held-out response (default: rollout.max_response_tokens)"
    )
    max_prompts: int | None = Field(
        None,
        ge=1,
        le=MAX_SEQUENCES,
        description="rl: held-out prompts per evaluation, the file's first ones (default: all)",
    )
    batches: int = Field(
        1, ge=1, le=MAX_STEPS, description="sft and pretrain: global batches of held-out data per evaluation"
    )


class RuntimeSpec(_Section):
    """The software stack the job will run on. Unset fields take the stack gdnctl is pinned to."""

    megatron_core: str | None = None
    megatron_bridge: str | None = None
    transformer_engine: str | None = Field(
        None,
        description="the trainer's Transformer Engine; 'none' builds the "
        "model with gdnctl's TE-free spec (no CP, no FP8)",
    )
    vllm: str | None = None
    flash_qla: str | None = Field(None, description="installed flash-qla; 'none' when it is not installed")
    fla: str | None = None
    cudnn: str | None = None
    triton: str | None = Field(None, description="the trainer's Triton, which compiles FLA's GDN kernels")
    transformers: str | None = Field(
        None, description="the trainer's transformers (the rl policy on device cpu is its Qwen3.5 / Qwen3-Next class)"
    )

    @field_validator("*")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is None or value == "none":
            return value
        value = str(value)
        if not versions.is_valid(value):
            raise ValueError(f"'{value}' is not a version number (like 0.19.2)")
        return value


class SlurmSpec(_Section):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = Field("04:00:00", description="wall-clock limit, HH:MM:SS or D-HH:MM:SS")
    cpus_per_task: int | None = Field(
        None, ge=1, le=MAX_CPUS, description=f"CPUs per node task (default: all of the node; at most {MAX_CPUS:,})"
    )
    mem: str | None = Field(None, description="memory per node, e.g. 0 (all) or 500G")
    constraint: str | None = None
    exclusive: bool = True
    requeue: bool = Field(
        True,
        description="requeue on preemption and node failure (--requeue; USR1 with more than 180 s left); false: "
        "--no-requeue, whatever the cluster's JobRequeue default",
    )
    time_limit_requeues: int = Field(
        0,
        ge=0,
        le=100,
        description="times the job requeues itself at its time "
        "limit (USR1 90 s before it) to go on from its last checkpoint; 0: it ends "
        "TIMEOUT. Needs requeue: true",
    )
    container_image: str | None = Field(None, description="trainer container image (pyxis --container-image)")
    extra_sbatch: list[str] = Field(default_factory=list, description="extra #SBATCH options, e.g. --reservation=x")

    @field_validator("mem", mode="before")
    @classmethod
    def _mem_number(cls, value: object) -> object:
        return _number_as_text(value, int)

    @model_validator(mode="after")
    def _time_limit_requeues_need_requeue(self) -> SlurmSpec:
        if self.time_limit_requeues and not self.requeue:
            raise ValueError("requeueing at the time limit (time_limit_requeues) needs requeue: true")
        return self

    @field_validator("partition", "account", "qos", "constraint", "mem")
    @classmethod
    def _directive_value(cls, value: str | None) -> str | None:
        if value is not None and not SBATCH_SAFE.fullmatch(value):
            raise ValueError(f"'{value}' cannot go into an #SBATCH line: {SBATCH_SAFE_TEXT}")
        return value

    @field_validator("time")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        if not re.fullmatch(r"(\d+-)?\d{1,2}(:\d{2}){0,2}|\d+", value):
            raise ValueError(f"'{value}' is not a Slurm time (HH:MM:SS or D-HH:MM:SS)")
        return value

    @field_validator("extra_sbatch")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for option in value:
            if not option.startswith("--") or not SBATCH_SAFE.fullmatch(option):
                raise ValueError(
                    f"'{option}' is not a single long sbatch option like --reservation=name ({SBATCH_SAFE_TEXT})"
                )
        return value


class LaunchSpec(_Section):
    executor: Literal["local", "slurm"] = "local"
    python: str = Field("python3", description="interpreter that runs the trainer (gdnctl.runtime)")
    env: dict[str, str] = Field(default_factory=dict, description="environment values written into the scripts")
    pass_env: list[str] = Field(
        default_factory=list, description="names passed through from the submitting shell, never written (secrets)"
    )
    kernel_cache_dir: str | None = Field(
        None,
        description="shared kernel cache: TileLang (FlashQLA), and Triton (FLA) "
        "and inductor under it (default: ~/.cache/gdnctl/tilelang)",
    )
    slurm: SlurmSpec = Field(default_factory=SlurmSpec)

    @field_validator("env", mode="before")
    @classmethod
    def _env_numbers_as_text(cls, value: Any) -> Any:
        """YAML reads `CUDA_DEVICE_MAX_CONNECTIONS: 1` as a number; the environment only holds text, so a number
        is written as YAML spelled it. true/false are refused: the shell would see Python's True, which no
        program reads as set."""
        if not isinstance(value, dict):
            return value
        text = {}
        for name, item in value.items():
            if isinstance(item, bool):
                raise ValueError(
                    f"the value of {name} is {str(item).lower()}, and environment values are text: "
                    f"quote it ('1', '0', 'true' or 'false', as the program reading {name} expects)"
                )
            text[name] = _number_as_text(item, int | float)
        return text

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"'{name}' is not a valid environment variable name")
        return value

    @field_validator("pass_env")
    @classmethod
    def _pass_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"'{name}' is not a valid environment variable name")
        return value


class SelftestSpec(_Section):
    steps: int = Field(3, ge=1, le=1000)


class WandbSpec(_Section):
    project: str = Field(min_length=1, max_length=128, description="Weights & Biases project")
    entity: str | None = Field(None, max_length=128, description="team or user (default: your W&B default)")
    mode: Literal["online", "offline"] | None = Field(
        None,
        description="offline writes the run into RUN_DIR/wandb for `wandb sync` later (no network needed); "
        "unset: the WANDB_MODE of the job's environment, else online",
    )


class MetricsSpec(_Section):
    """metrics.jsonl and TensorBoard event files are always written into the run dir; W&B when asked for."""

    wandb: WandbSpec | None = Field(None, description="also log every step to Weights & Biases")


class Preset(_Section):
    name: str = Field(min_length=1, max_length=128, description="one line of printable text")
    description: str | None = None
    job: JobKind
    model: ModelSpec
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    kernels: KernelsSpec = Field(default_factory=KernelsSpec)
    speed: SpeedSpec = Field(default_factory=SpeedSpec)
    comm: CommSpec = Field(default_factory=CommSpec)
    rollout: RolloutSpec | None = None
    grpo: GrpoSpec = Field(default_factory=GrpoSpec)
    eval: EvalSpec | None = Field(None, description="held-out evaluation during the run; null: none")
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    launch: LaunchSpec = Field(default_factory=LaunchSpec)
    selftest: SelftestSpec = Field(default_factory=SelftestSpec)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)

    @field_validator("name")
    @classmethod
    def _one_line(cls, value: str) -> str:
        # The name goes into the job name, script comments and GDNCTL_JOB_NAME: a newline would start a new line.
        if not value.isprintable():
            raise ValueError("name must be one line of printable text (no newlines, tabs or control characters)")
        return value
