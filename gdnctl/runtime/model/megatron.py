"""A Qwen3.5 / Qwen3-Next model built from Megatron-Core modules alone (no Transformer Engine).

Megatron-Core's own GDN block spec (`get_transformer_block_with_experimental_attention_variant_spec`) asserts
`transformer_impl == "transformer_engine"`, and its local provider has no fused layernorm-linear for the GDN
input projection, no zero-centered RMSNorm and a core attention without packed sequences. This module fills
exactly those three gaps and otherwise uses Megatron-Core's classes: GatedDeltaNet, SelfAttention with the output
gate, MLP / MoELayer, TransformerLayer, GPTModel. The result has the layer names and tensor layouts of the
TE model, so the HF conversion (hf_weights.py) is the same for both.

Norm semantics follow the HF modules one to one, so HF weights load without arithmetic:
- decoder norms and q/k norms are zero-centered, y = x_hat * (1 + w), w initialised to 0 (Qwen3_5RMSNorm);
- the GDN output norm is plain, y = x_hat * w, w initialised to 1 (Qwen3_5RMSNormGated; the gate is applied by
  GatedDeltaNet itself).
"""

from __future__ import annotations

import torch
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec_for_backend
from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_layer import (
    TransformerLayer,
    TransformerLayerSubmodules,
    get_transformer_layer_offset,
)

from gdnctl.knowledge import ModelArch
from gdnctl.runtime.model.core_attention import TorchCoreAttention
from gdnctl.runtime.model.hf_weights import padded_vocab_size
from gdnctl.runtime.model.megatron_config import (  # noqa: F401 (INIT_METHOD_STD: re-exported)
    INIT_METHOD_STD,
    ModelBuildError,
    transformer_config_kwargs,
)
from gdnctl.schema import EngineConfig


class _RMSNorm(torch.nn.Module):
    """RMSNorm with the signature Megatron's build_module passes (config, hidden_size, eps).

    Computed in fp32 and cast back, as the HF modules do. With sequence parallel the weight is marked so
    Megatron's DDP all-reduces its gradient over the tensor-parallel group (each TP rank sees a sequence shard).
    """

    offset = 0.0
    initial = 1.0

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(
            torch.full((hidden_size,), self.initial, dtype=config.params_dtype, device=torch.cuda.current_device())
        )
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (self.offset + self.weight.float())).type_as(x)


class ZeroCenteredRMSNorm(_RMSNorm):
    """Qwen3_5RMSNorm: y = x_hat * (1 + w)."""

    offset = 1.0
    initial = 0.0


class GatedOutputRMSNorm(_RMSNorm):
    """The norm inside Qwen3_5RMSNormGated: y = x_hat * w (GatedDeltaNet multiplies by silu(z) after it)."""


class _Provider(LocalSpecProvider):
    """Megatron-Core's local modules, with the zero-centered RMSNorm everywhere a norm is asked for."""

    def layer_norm(self, rms_norm: bool = False, for_qk: bool = False, has_residual: bool = False):
        return ZeroCenteredRMSNorm


def gated_delta_net_spec() -> ModuleSpec:
    return ModuleSpec(
        module=GatedDeltaNet,
        submodules=GatedDeltaNetSubmodules(
            in_proj=ColumnParallelLinear, out_norm=GatedOutputRMSNorm, out_proj=RowParallelLinear
        ),
    )


def gated_attention_spec() -> ModuleSpec:
    return ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(
            linear_qkv=ColumnParallelLinear,
            core_attention=TorchCoreAttention,
            linear_proj=RowParallelLinear,
            q_layernorm=ZeroCenteredRMSNorm,
            k_layernorm=ZeroCenteredRMSNorm,
        ),
    )


def block_spec(arch: ModelArch, layer_indices: range) -> TransformerBlockSubmodules:
    provider = _Provider()
    if arch.is_moe:
        mlp = get_moe_module_spec_for_backend(
            backend=provider, num_experts=arch.num_experts, moe_grouped_gemm=False, use_te_activation_func=False
        )
    else:
        mlp = ModuleSpec(
            module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
        )
    layers = []
    for index in layer_indices:
        attention = gated_delta_net_spec() if arch.layer_is_gdn(index) else gated_attention_spec()
        layers.append(
            ModuleSpec(
                module=TransformerLayer,
                submodules=TransformerLayerSubmodules(
                    input_layernorm=ZeroCenteredRMSNorm,
                    self_attention=attention,
                    self_attn_bda=get_bias_dropout_add,
                    pre_mlp_layernorm=ZeroCenteredRMSNorm,
                    mlp=mlp,
                    mlp_bda=get_bias_dropout_add,
                ),
            )
        )
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=ZeroCenteredRMSNorm)


def transformer_config(config: EngineConfig) -> TransformerConfig:
    return TransformerConfig(**transformer_config_kwargs(config))


def build_gpt_model(
    config: EngineConfig, transformer: TransformerConfig, *, pre_process: bool = True, post_process: bool = True
) -> GPTModel:
    arch = config.model
    # With pipeline parallel each stage builds its own slice of the layers (the pattern is global).
    first = get_transformer_layer_offset(transformer)
    local_layers = range(first, first + get_num_layers_to_build(transformer))
    return GPTModel(
        config=transformer,
        transformer_layer_spec=block_spec(arch, local_layers),
        vocab_size=padded_vocab_size(arch.vocab_size, config.parallel.tp),
        max_sequence_length=config.train.seq_length,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_percent=arch.partial_rotary_factor,
        rotary_base=int(arch.rope_theta),
    )
