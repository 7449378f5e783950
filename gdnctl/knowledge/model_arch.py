"""The architecture of a Qwen3.5 / Qwen3-Next GDN model: what the catalog and a checkpoint's config.json describe.

Model knowledge, shared by every layer: the rules reason about it, the engine config carries it to the runtime,
and the runtime builds the model from it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gdnctl.knowledge.model_families import ModelFamily, family_of, known_model_types

# A size or count of the architecture: at least 1 (the rules and the memory estimate divide by them) and within
# int32, as Megatron-Core and the kernels index them. A checkpoint's config.json outside this is refused (PRE003).
Size = Annotated[int, Field(ge=1, le=2**31 - 1)]


class ModelArch(BaseModel):
    """Architecture of the model being run (catalog or checkpoint config.json, already merged)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    id: str | None
    path: str | None
    model_type: str
    architecture: str
    num_layers: Size
    hidden_size: Size
    num_attention_heads: Size
    num_key_value_heads: Size
    head_dim: Size
    linear_num_key_heads: Size
    linear_num_value_heads: Size
    linear_key_head_dim: Size
    linear_value_head_dim: Size
    linear_conv_kernel_dim: Size
    full_attention_interval: Size
    vocab_size: Size
    tie_word_embeddings: bool
    ffn_hidden_size: Size | None
    num_experts: Size | None
    num_experts_per_tok: Size | None
    moe_ffn_hidden_size: Size | None
    shared_expert_ffn_hidden_size: Annotated[int, Field(ge=0, le=2**31 - 1)] | None  # 0: TRN006 says why
    mtp_num_layers: Annotated[int, Field(ge=0, le=1024)]
    rms_norm_eps: Annotated[float, Field(gt=0)]
    rope_theta: Annotated[float, Field(gt=0)]
    partial_rotary_factor: Annotated[float, Field(gt=0, le=1)]
    # False for gdnctl's own test/benchmark architectures: no weights exist, so training starts from random ones.
    released: bool

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)

    @property
    def moe_sizes(self) -> tuple[int, int, int]:
        """(num_experts, num_experts_per_tok, moe_ffn_hidden_size) of a MoE model, for arithmetic that needs all
        three: the fields are optional because a dense model has none."""
        if not (self.num_experts and self.num_experts_per_tok and self.moe_ffn_hidden_size):
            raise ValueError(
                f"{self.model_type}: a MoE model needs num_experts, num_experts_per_tok and "
                f"moe_ffn_hidden_size (got {self.num_experts}, {self.num_experts_per_tok}, "
                f"{self.moe_ffn_hidden_size})"
            )
        return self.num_experts, self.num_experts_per_tok, self.moe_ffn_hidden_size

    @field_validator("model_type")
    @classmethod
    def _a_known_family(cls, model_type: str) -> str:
        if family_of(model_type) is None:
            raise ValueError(
                f"model_type {model_type!r} is not a Gated DeltaNet family gdnctl runs ({known_model_types()})"
            )
        return model_type

    @property
    def family(self) -> ModelFamily:
        """What gdnctl knows of the model's family (knowledge/model_families.py), from its model_type."""
        family = family_of(self.model_type)
        if family is None:  # only a model_copy can get here: construction refuses it
            raise ValueError(f"model_type {self.model_type!r} is not a family gdnctl runs ({known_model_types()})")
        return family

    @property
    def text_only(self) -> bool:
        """Text-only classes (`*ForCausalLM`); the released Qwen3.5 checkpoints are vision-language."""
        return self.architecture.endswith("ForCausalLM")

    @property
    def label(self) -> str:
        return self.id or self.path or self.model_type

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers // self.full_attention_interval

    def layer_is_gdn(self, index: int) -> bool:
        """Every `full_attention_interval`-th layer (1-based) is full attention, the others GDN."""
        return (index + 1) % self.full_attention_interval != 0

    @property
    def num_gdn_layers(self) -> int:
        return self.num_layers - self.num_full_attention_layers
