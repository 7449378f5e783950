"""Model FLOPs of a Qwen3.5 / Qwen3-Next GDN model per trained token, for the trainer's TFLOPS estimate.

Counted as 2 FLOPs per multiply-add in the forward pass, times 3 for forward + backward (activation
recomputation is not counted: this is model FLOPs, as MFU reports it). Terms per token:

- GDN layer: input projection (q, k, v, z, beta, alpha), output projection, depthwise conv, and the chunked
  delta rule per value head: ~4 state-sized products (state update, output, and the WY terms) of dk x dv,
  plus the intra-chunk products of length CHUNK over dk and dv.
- Full-attention layer: q (with its output gate), k, v and output projections, plus QK^T and PV over the
  causal context, on average half the sequence.
- MLP: SwiGLU's three matrices; MoE: router, top-k experts and the shared expert with its gate.
- The output projection to the vocabulary.
"""

from __future__ import annotations

from gdnctl.knowledge.model_arch import ModelArch

CHUNK = 64  # the chunk length of FLA's and FlashQLA's chunked delta rule
TRAIN_FACTOR = 3  # backward is twice the forward


def _gdn_layer(arch: ModelArch) -> float:
    hidden, heads = arch.hidden_size, arch.linear_num_value_heads
    dk, dv = arch.linear_key_head_dim, arch.linear_value_head_dim
    qk_dim, v_dim = arch.linear_num_key_heads * dk, heads * dv
    projections = hidden * (2 * qk_dim + 2 * v_dim + 2 * heads) + v_dim * hidden
    conv = arch.linear_conv_kernel_dim * (2 * qk_dim + v_dim)
    delta_rule = heads * (4 * dk * dv + CHUNK * (2 * dk + dv))
    return 2 * (projections + conv + delta_rule)


def _attention_layer(arch: ModelArch, context: float) -> float:
    hidden, dim = arch.hidden_size, arch.head_dim
    heads, groups = arch.num_attention_heads, arch.num_key_value_heads
    projections = hidden * (2 * heads * dim + 2 * groups * dim) + heads * dim * hidden
    scores_and_values = 2 * heads * dim * context
    return 2 * (projections + scores_and_values)


def _mlp(arch: ModelArch) -> float:
    hidden = arch.hidden_size
    if not arch.is_moe:
        return 2 * 3 * hidden * (arch.ffn_hidden_size or 0)
    num_experts, per_token, expert_width = arch.moe_sizes
    experts = per_token * 3 * hidden * expert_width
    shared = 0
    if arch.shared_expert_ffn_hidden_size:
        shared = 3 * hidden * arch.shared_expert_ffn_hidden_size + hidden
    return 2 * (hidden * num_experts + experts + shared)


def forward_flops_per_token(arch: ModelArch, mean_sequence_length: float) -> float:
    context = mean_sequence_length / 2  # causal: a token attends to half the sequence on average
    layers = (
        arch.num_gdn_layers * _gdn_layer(arch)
        + arch.num_full_attention_layers * _attention_layer(arch, context)
        + arch.num_layers * _mlp(arch)
    )
    return layers + 2 * arch.hidden_size * arch.vocab_size


def train_flops_per_token(arch: ModelArch, mean_sequence_length: float) -> float:
    return TRAIN_FACTOR * forward_flops_per_token(arch, mean_sequence_length)
