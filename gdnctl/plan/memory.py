"""Per-GPU memory estimate for the trainer (and the rollout's weight share).

A coarse, documented model, good to tell "fits / tight / cannot fit" apart, not to the last GiB:
- parameters counted from the architecture (GDN and gated-attention layers, dense MLP or MoE, embeddings,
  the MTP layer when trained); non-expert weights split over tp and pipeline stages, experts over ep x etp;
- bf16 weights (2 B/param), main gradients in speed.grad_reduce's dtype (bf16 2 B/param, fp32 4), Adam in fp32
  (master + 2 moments, 12 B/param) sharded over the data-parallel group by the distributed optimizer, or on the
  CPU when offloaded;
- with train.lora: the base frozen in bf16 with no gradient and no optimizer state (megatron-bridge's PEFT sets
  requires_grad False on every base parameter, peft/base.py freeze_model, 0.6.2, and Megatron's DDP and
  optimizer hold only parameters that require a gradient), plus the adapters (`LoraCount`): bf16 like the model
  (LoRA's lora_dtype None), with their own gradients and Adam state as above;
- activations of the first pipeline stage: bf16 tensors kept for backward per token per layer (see
  `_activation_bytes_per_token`), times the micro-batches in flight under 1F1B (min(pp, micro-batches)),
  cut by recompute; plus the logits and fp32 loss over the vocab shard on the last stage (rl jobs: over a row of
  the rollout's context, with the fp32 log-prob tensor as its own row: the 248k-vocabulary log-prob OOM of
  NVIDIA-NeMo/RL #2668 and NovaSky-AI/SkyRL #1610);
- with train.images, the vision tower: its bf16 weights whole on every GPU (plus, with train.vision: train, its
  gradients and Adam state), and the activations of the longest prompt's images: train.images.max_per_sample
  images of train.images.max_pixels each (at most the processor's max_pixels once resized), their patches through
  every block when the tower trains, only the merged image tokens it hands the language model when frozen; those
  image tokens are inside seq_length, so the language model's rows above count them already;
- a flat allowance for the CUDA context, NCCL buffers and allocator slack.

The preset's sizes are bounded by its schema, so that every product here is a finite float. A checkpoint's
config.json has no such bounds: sizes past float range give an infinite estimate ("does not fit") rather than
an OverflowError in the middle of `gdnctl validate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gdnctl.knowledge import ModelArch, lora

GIB = 1024**3
OVERHEAD_GIB = 3.0  # CUDA context (~0.5 GiB), NCCL communicators and buffers, allocator fragmentation
# Bytes per logit a micro-batch keeps for the loss, by cross-entropy implementation: Megatron-Core's native fused
# loss keeps the bf16 logits and an fp32 copy; Transformer Engine's keeps the bf16 logits and one bf16 buffer of
# their size for the gradient (transformer_engine/pytorch/triton/cross_entropy.py, 2.20.2: `saved_input`).
LOGITS_BYTES_PER_ENTRY = {"native": 2 + 4, "te": 2 + 2}
# The training rows that stay allocated between steps (the rest, activations and logits, each step adds and frees):
# what a colocated trainer keeps while vLLM generates, and what the trainer's resident_memory_gib measures.
RESIDENT_ROWS = ("weights", "gradients", "optimizer")
RECOMPUTE_KEEP = {"none": 1.0, "selective": 0.85}  # share of activations kept; "full" keeps layer inputs only


@dataclass(frozen=True)
class ParamCounts:
    embedding: int
    output: int
    gdn_layer: int
    attention_layer: int
    dense_mlp: int  # per layer (0 for MoE)
    experts: int  # per layer, all routed experts
    shared_and_router: int  # per layer (MoE)
    mtp: int  # MTP layer without its experts
    mtp_experts: int

    def total(self, model: ModelArch, with_mtp: bool = True) -> int:
        layers = (
            model.num_gdn_layers * self.gdn_layer
            + model.num_full_attention_layers * self.attention_layer
            + model.num_layers * (self.dense_mlp + self.experts + self.shared_and_router)
        )
        mtp = (self.mtp + self.mtp_experts) * model.mtp_num_layers if with_mtp else 0
        return self.embedding + self.output + layers + mtp


@dataclass(frozen=True)
class LoraCount:
    """Adapter parameters of the whole model: dense (attention, GDN, dense MLP, shared expert) and routed-expert
    adapters, one per expert or, `shared`, one for all of a layer's experts (knowledge/lora.py)."""

    dense: int
    experts: int
    shared: bool = False

    @property
    def total(self) -> int:
        return self.dense + self.experts


def count_lora_params(m: ModelArch, targets: tuple[str, ...], rank: int, shared_experts: bool = False) -> LoraCount:
    experts = tuple(name for name in targets if name == "experts")
    return LoraCount(
        dense=lora.adapter_params(m, tuple(name for name in targets if name != "experts"), rank),
        experts=lora.adapter_params(m, experts, rank, shared_experts),
        shared=shared_experts,
    )


def _mlp_params(m: ModelArch) -> tuple[int, int, int]:
    """(dense MLP, routed experts, shared expert + router) parameters of one layer."""
    h = m.hidden_size
    if m.is_moe:
        num_experts, _, expert_width = m.moe_sizes
        experts = num_experts * 3 * h * expert_width
        shared = 3 * h * (m.shared_expert_ffn_hidden_size or 0) + h  # + shared-expert gate
        return 0, experts, shared + h * num_experts
    return 3 * h * (m.ffn_hidden_size or 0), 0, 0


def count_params(m: ModelArch) -> ParamCounts:
    h = m.hidden_size
    key_width = m.linear_num_key_heads * m.linear_key_head_dim
    value_width = m.linear_num_value_heads * m.linear_value_head_dim
    gdn = (
        h * (2 * key_width + 2 * value_width + 2 * m.linear_num_value_heads)  # in_proj q,k,v,z + b,a
        + (2 * key_width + value_width) * m.linear_conv_kernel_dim  # causal conv1d
        + 2 * m.linear_num_value_heads
        + m.linear_value_head_dim  # A_log, dt_bias, gated norm
        + value_width * h
        + 2 * h
    )  # out_proj, layer norms
    q_width = m.num_attention_heads * m.head_dim
    attention = (
        h * 2 * q_width  # q and its output gate
        + 2 * h * m.num_key_value_heads * m.head_dim
        + q_width * h
        + 2 * m.head_dim
        + 2 * h
    )
    dense, experts, shared = _mlp_params(m)
    embedding = m.vocab_size * h
    return ParamCounts(
        embedding=embedding,
        output=0 if m.tie_word_embeddings else embedding,
        gdn_layer=gdn,
        attention_layer=attention,
        dense_mlp=dense,
        experts=experts,
        shared_and_router=shared,
        mtp=2 * h * h + 3 * h + attention + dense + shared,
        mtp_experts=experts,
    )


def _activation_bytes_per_token(m: ModelArch) -> tuple[float, float]:
    """bf16 bytes kept for backward per token: (average mixer layer, MLP/MoE block), before TP split."""
    h = m.hidden_size
    key_width = m.linear_num_key_heads * m.linear_key_head_dim
    value_width = m.linear_num_value_heads * m.linear_value_head_dim
    gdn = 2 * (
        4 * h
        + (2 * key_width + 2 * value_width + 2 * m.linear_num_value_heads)
        + (2 * key_width + value_width)
        + 2 * value_width
    )
    q_width = m.num_attention_heads * m.head_dim
    attention = 2 * (4 * h + 2 * q_width + 2 * m.num_key_value_heads * m.head_dim + 2 * q_width)
    mixer = (gdn * m.num_gdn_layers + attention * m.num_full_attention_layers) / max(m.num_layers, 1)
    if m.is_moe:
        num_experts, per_token, expert_width = m.moe_sizes
        mlp = (
            per_token * 2 * (2 * h + 4 * expert_width)
            + 2 * (2 * h + 4 * (m.shared_expert_ffn_hidden_size or 0))
            + 4 * num_experts
        )
    else:
        mlp = 2 * (2 * h + 4 * (m.ffn_hidden_size or 0))
    return mixer, mlp


def _gathered_qkv_bytes_per_token(m: ModelArch, tp: int) -> float:
    """bf16 bytes per token, averaged over layers, that every TP rank keeps beyond its share when TP exceeds the
    KV heads: Megatron-Core then all-gathers the whole QKV-and-gate projection on each rank and slices its query
    group out of it (megatron/core/transformer/attention.py, get_query_key_value_tensors: "Assemble the full ...
    through an AG", 0.19.2 lines 1840-1859), and the value and gate kept for backward are views of that gathered
    tensor, so its storage stays alive until the layer's backward (about 1.4 GiB per rank for Qwen3.5-35B-A3B at
    TP 4 with 8k tokens and no recompute; read from the code, not measured)."""
    if tp <= m.num_key_value_heads:
        return 0.0
    width = 2 * m.num_attention_heads * m.head_dim + 2 * m.num_key_value_heads * m.head_dim  # q, gate, k, v
    return 2 * width * m.num_full_attention_layers / max(m.num_layers, 1)


@dataclass(frozen=True)
class MemoryRow:
    name: str
    gib: float
    note: str


@dataclass(frozen=True)
class MemoryEstimate:
    rows: tuple[MemoryRow, ...]
    capacity_gib: float

    @property
    def total_gib(self) -> float:
        return sum(row.gib for row in self.rows)

    @property
    def usage(self) -> float:
        return self.total_gib / self.capacity_gib if self.capacity_gib else 0.0


def _real(count: int) -> float:
    """An exact count as a float; one past float range (only a hostile config.json has one) is infinite."""
    try:
        return float(count)
    except OverflowError:
        return math.inf if count > 0 else -math.inf


def estimate_training(run) -> MemoryEstimate:
    """Peak per-GPU memory of the most loaded pipeline stage. `run` must have a whole dp."""
    try:
        return _estimate_training(run)
    except OverflowError:  # a config.json size past float range met a division or a float
        return MemoryEstimate(
            (MemoryRow("weights", math.inf, "the checkpoint's sizes are past float range"),), run.gpu.memory_gib
        )


def _estimate_training(run) -> MemoryEstimate:
    m, p, t = run.model, run.preset.parallel, run.preset.train
    counts = count_params(m)
    layers_per_stage = m.num_layers / p.pp
    mtp_layers = m.mtp_num_layers if t.mtp else 0
    # Dense (non-expert) parameters of the heaviest stage: stage 0 holds the embedding, the last stage the
    # output layer and MTP; with pp == 1 both are the same stage.
    # Per-layer mean; max(..., 1): a config.json may claim no layers, whose sum is 0 however it is divided.
    layer_dense = (
        counts.gdn_layer * m.num_gdn_layers
        + counts.attention_layer * m.num_full_attention_layers
        + (counts.dense_mlp + counts.shared_and_router) * m.num_layers
    ) / max(m.num_layers, 1)
    body = layer_dense * layers_per_stage
    first = body + counts.embedding
    last = body + counts.output + counts.mtp * mtp_layers + (counts.embedding if m.tie_word_embeddings else 0)
    dense_per_gpu = (first + last - body if p.pp == 1 else max(first, last)) / p.tp
    expert_per_gpu = (counts.experts * (layers_per_stage + mtp_layers)) / (p.ep * p.etp)
    params = dense_per_gpu + expert_per_gpu

    dp = run.dp or 1
    # What trains: every parameter, or (LoRA) the adapters alone, split like the linears they wrap: dense ones over
    # tp and the pipeline stages, the experts' over ep x etp and the stages (a shared experts' adapter is whole on
    # every EP rank, split over etp). The base stays as `params`, frozen.
    dense_trained, expert_trained = dense_per_gpu, expert_per_gpu
    if t.lora:
        shared = run.lora_expert_adapters.value == "shared"
        adapters = count_lora_params(m, run.lora_targets.value, t.lora.rank, shared)
        dense_trained = adapters.dense / (p.tp * p.pp)
        expert_trained = adapters.experts / ((1 if adapters.shared else p.ep) * p.etp * p.pp)
    trainable = dense_trained + expert_trained
    dense_shard = dp * p.cp if t.distributed_optimizer else 1
    expert_shard = max(1, run.world_size.value // (p.ep * p.etp * p.pp)) if t.distributed_optimizer else 1
    if t.optimizer_cpu_offload:
        optimizer = 0.0
    else:
        optimizer = 12 * (dense_trained / dense_shard + expert_trained / expert_shard)

    tokens = t.micro_batch_size * t.seq_length / p.cp
    mixer, mlp = _activation_bytes_per_token(m)
    gathered = _gathered_qkv_bytes_per_token(m, p.tp)
    per_layer = tokens * ((mixer + mlp) / p.tp + gathered)
    num_microbatches = max(1, t.global_batch_size // (t.micro_batch_size * dp))
    in_flight = min(p.pp, num_microbatches)
    if t.recompute == "full":
        kept = tokens * 2 * m.hidden_size / p.tp * layers_per_stage * in_flight + per_layer
        act_note = f"full recompute: layer inputs x {in_flight} micro-batch(es) in flight + one layer"
    else:
        kept = per_layer * layers_per_stage * in_flight * RECOMPUTE_KEEP[t.recompute]
        act_note = f"{t.recompute} recompute, {layers_per_stage:g} layers x {in_flight} micro-batch(es) in flight"
    if gathered:
        act_note += (
            f"; tp {p.tp} above {m.num_key_value_heads} KV heads: each rank keeps the whole gathered QKV projection"
        )
    cross_entropy = run.speed["cross_entropy"].value
    logits = tokens * (m.vocab_size / p.tp) * LOGITS_BYTES_PER_ENTRY[cross_entropy]
    logits_note = (
        f"bf16 logits + fp32 loss over {m.vocab_size // p.tp} vocab entries"
        if cross_entropy == "native"
        else f"bf16 logits and their gradient over {m.vocab_size // p.tp} vocab entries (TE cross entropy)"
    )
    rl_rows: tuple[MemoryRow, ...] = ()
    if run.preset.job == "rl" and run.preset.rollout is not None:
        # An rl micro-batch is rows of prompt + response, up to the rollout's context, scored by the same
        # vocab-parallel loss (runtime/rl/policy/megatron_policy.py): its bf16 logits, and the fp32 copy the loss
        # computes the log-probs in, kept for the backward.
        context = run.preset.rollout.max_model_len or t.seq_length
        rl_tokens = t.micro_batch_size * context / p.cp
        logits = rl_tokens * (m.vocab_size / p.tp) * 2
        logits_note = f"bf16 logits of an rl micro-batch ({t.micro_batch_size} x {context} tokens)"
        rl_rows = (
            MemoryRow(
                "rl log-probs",
                rl_tokens * (m.vocab_size / p.tp) * 4 / GIB,
                f"fp32 logits: {t.micro_batch_size} x {context} tokens x {m.vocab_size // p.tp} vocab entries",
            ),
        )

    grad_dtype = run.speed["grad_reduce"].value
    grad_bytes = 2 if grad_dtype == "bf16" else 4
    adapter_note = f" (LoRA: {trainable / 1e6:.2f}M adapter params on this GPU)" if t.lora else ""
    weights_note = (
        f"bf16, {params / 1e9:.2f}B params on this GPU (experts / ep x etp = {expert_per_gpu / 1e9:.2f}B)"
        if not t.lora
        else f"bf16, {params / 1e9:.2f}B frozen base params + {trainable / 1e6:.2f}M adapter params on this GPU"
    )
    rows = (
        MemoryRow("weights", 2 * (params + (trainable if t.lora else 0.0)) / GIB, weights_note),
        *_vision_rows(run, dense_shard),
        MemoryRow("gradients", grad_bytes * trainable / GIB, f"{grad_dtype} main grads{adapter_note}"),
        MemoryRow(
            "optimizer",
            optimizer / GIB,
            "offloaded to CPU"
            if t.optimizer_cpu_offload
            else f"Adam fp32 x3, dense / {dense_shard}, experts / {expert_shard}{adapter_note}",
        ),
        MemoryRow("activations", kept / GIB, act_note),
        MemoryRow("logits", logits / GIB, logits_note),
        *rl_rows,
        MemoryRow("overhead", OVERHEAD_GIB, "CUDA context, NCCL buffers, allocator slack"),
    )
    return MemoryEstimate(rows, run.gpu.memory_gib)


def image_tokens_of_longest_prompt(run) -> int:
    """Image tokens of a prompt holding train.images.max_per_sample images of train.images.max_pixels each."""
    images, vision = run.preset.train.images, run.model.vision
    if images is None or vision is None:
        return 0
    return images.max_per_sample * vision.tokens_for_pixels(images.max_pixels)


def _vision_rows(run, optimizer_shard: int) -> tuple[MemoryRow, ...]:
    """The vision tower's row of a job on images (none for a text job)."""
    vision, t = run.model.vision, run.preset.train
    if t.images is None or vision is None:
        return ()
    params = vision.params()
    trains = t.vision == "train"
    tokens = image_tokens_of_longest_prompt(run)
    patches = tokens * vision.spatial_merge_size**2 * t.micro_batch_size
    if trains:
        # bf16 per block: the two norms' inputs, q, k, v, the attention output, the MLP's two hidden activations
        activations = patches * vision.depth * (6 * vision.hidden_size + 2 * vision.intermediate_size) * 2
    else:
        activations = tokens * t.micro_batch_size * vision.out_hidden_size * 2
    state = (4 + 12 / optimizer_shard) * params if trains else 0.0
    note = (
        f"{params / 1e6:.0f}M params, {'trained' if trains else 'frozen'}; the longest prompt's "
        f"{t.images.max_per_sample} image(s) give {tokens:,} image tokens ({patches:,} patches per micro-batch)"
    )
    return (MemoryRow("vision tower", (2 * params + state + activations) / GIB, note),)


def rollout_weights_gib(run) -> float:
    """bf16 weights on one rollout GPU (vLLM shards everything over its tp)."""
    counts = count_params(run.model)
    return _real(2 * counts.total(run.model, with_mtp=False)) / run.preset.rollout.tp / GIB


def rollout_share(run) -> MemoryRow:
    """What vLLM holds on one of its GPUs: rollout.gpu_memory_utilization of the GPU (weights, then the KV cache
    in what profiling leaves), or with rollout.kv_cache_gib the weights plus that fixed KV cache (vLLM skips the
    profiling: vllm/v1/worker/gpu_worker.py determine_available_memory, 0.26.0)."""
    kv_cache_gib = run.preset.rollout.kv_cache_gib
    weights = rollout_weights_gib(run)
    if kv_cache_gib is not None:
        return MemoryRow(
            "vLLM", weights + kv_cache_gib, f"{weights:.1f} GiB of weights + kv_cache_gib {kv_cache_gib:g}"
        )
    gib, share = _utilization_share(run)
    return MemoryRow("vLLM", gib, f"{share}: {weights:.1f} GiB of weights, the rest KV cache")


def rollout_startup_free(run) -> MemoryRow:
    """What vLLM wants free when it starts, fixed KV cache or not: gpu_memory_utilization of the GPU
    (vllm/v1/worker/utils.py request_memory, 0.26.0)."""
    gib, share = _utilization_share(run)
    return MemoryRow("vLLM start-up", gib, f"{share} free when vLLM starts")


def _utilization_share(run) -> tuple[float, str]:
    """rollout.gpu_memory_utilization of the GPU, in GiB, and how it was reckoned."""
    utilization, capacity = run.preset.rollout.gpu_memory_utilization, run.gpu.memory_gib
    return utilization * capacity, f"gpu_memory_utilization {utilization} x {capacity:g} GiB"


def estimate_rollout_phase(run, vllm: MemoryRow | None = None) -> MemoryEstimate | None:
    """Per-GPU memory while a colocated vLLM generates: the trainer keeps its weights, gradients and optimizer
    state (it frees only its activations and cached blocks, runtime/rl/job.py), and vLLM wakes into the
    share it took at start-up (rollout_share: vLLM's sleep mode re-allocates exactly what it released); `vllm`
    replaces that row (rollout_startup_free: the moment vLLM starts). None when the rollout has GPUs of its
    own."""
    rollout = run.preset.rollout
    if run.preset.job != "rl" or rollout is None or not rollout.colocate or run.gpu.sm is None or run.dp is None:
        return None
    training = estimate_training(run)
    kept = (*RESIDENT_ROWS, "overhead")
    rows = [
        MemoryRow(row.name, row.gib, row.note if row.name == "overhead" else f"the trainer's: {row.note}")
        for row in training.rows
        if row.name in kept
    ]
    rows.insert(-1, vllm or rollout_share(run))
    return MemoryEstimate(tuple(rows), run.gpu.memory_gib)
