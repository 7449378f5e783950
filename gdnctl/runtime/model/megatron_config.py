"""The keyword arguments of Megatron-Core's `TransformerConfig` for an engine config, without importing Megatron.

`megatron.transformer_config` constructs `TransformerConfig(**transformer_config_kwargs(config))`; keeping the
arguments a plain dict lets a CPU test construct the same object against an installed megatron-core (and see
which arguments an older release does not know) without importing the model's GPU-side modules.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from gdnctl.errors import GdnctlError
from gdnctl.schema import EngineConfig

# Megatron's initialisation std for the linear layers (Qwen3.5's config.json: initializer_range 0.02).
INIT_METHOD_STD = 0.02


class ModelBuildError(GdnctlError, ValueError):
    """The engine config asks for a model this builder cannot make."""


def transformer_config_kwargs(config: EngineConfig) -> dict[str, Any]:
    """The arguments `transformer_config` passes to Megatron-Core's TransformerConfig (ModelParallelConfig's too)."""
    arch, parallel, train = config.model, config.parallel, config.train
    if parallel.cp > 1:
        raise ModelBuildError(
            "parallel.cp > 1 needs Transformer Engine's context-parallel attention, and gdnctl "
            "builds the model without TE (TRN002); set parallel.cp: 1."
        )
    if train.precision != "bf16":
        raise ModelBuildError(
            f"train.precision {train.precision} needs Transformer Engine, and gdnctl builds the "
            "model without TE (TRN002); set train.precision: bf16."
        )
    moe = {}
    if arch.is_moe:
        moe = dict(
            num_moe_experts=arch.num_experts,
            moe_router_topk=arch.num_experts_per_tok,
            moe_ffn_hidden_size=arch.moe_ffn_hidden_size,
            moe_shared_expert_intermediate_size=arch.shared_expert_ffn_hidden_size,
            moe_shared_expert_gate=bool(arch.shared_expert_ffn_hidden_size),
            # Qwen3.5 MoE: softmax over all experts, then top-k renormalised (norm_topk_prob), aux loss 1e-3.
            moe_router_pre_softmax=False,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-3,
            moe_token_dispatcher_type="alltoall",
            moe_router_dtype="fp32",
            moe_grouped_gemm=False,
            expert_model_parallel_size=parallel.ep,
            expert_tensor_parallel_size=parallel.etp,
        )
    recompute = {}
    if train.recompute == "full":
        recompute = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif train.recompute == "selective":
        recompute = dict(recompute_granularity="selective")
    return dict(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_key_value_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size or arch.moe_ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        qk_layernorm=True,
        attention_output_gate=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        experimental_attention_variant="gated_delta_net",
        linear_attention_freq=arch.full_attention_interval,
        linear_conv_kernel_dim=arch.linear_conv_kernel_dim,
        linear_key_head_dim=arch.linear_key_head_dim,
        linear_value_head_dim=arch.linear_value_head_dim,
        linear_num_key_heads=arch.linear_num_key_heads,
        linear_num_value_heads=arch.linear_num_value_heads,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=parallel.tp,
        pipeline_model_parallel_size=parallel.pp,
        context_parallel_size=parallel.cp,
        sequence_parallel=parallel.sequence_parallel,
        # The fusions below need apex or Transformer Engine.
        apply_rope_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        bias_dropout_fusion=False,
        init_method_std=INIT_METHOD_STD,
        transformer_impl="local",
        calculate_per_token_loss=True,
        **moe,
        **recompute,
    )
