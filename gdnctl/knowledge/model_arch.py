"""The architecture of a Qwen3.5 / Qwen3-Next GDN model: what the catalog and a checkpoint's config.json describe.

Model knowledge, shared by every layer: the rules reason about it, the engine config carries it to the runtime,
and the runtime builds the model from it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ModelArch(BaseModel):
    """Architecture of the model being run (catalog or checkpoint config.json, already merged)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str | None
    path: str | None
    model_type: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    full_attention_interval: int
    vocab_size: int
    tie_word_embeddings: bool
    ffn_hidden_size: int | None
    num_experts: int | None
    num_experts_per_tok: int | None
    moe_ffn_hidden_size: int | None
    shared_expert_ffn_hidden_size: int | None
    mtp_num_layers: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    # False for gdnctl's own test/benchmark architectures: no weights exist, so training starts from random ones.
    released: bool

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)

    @property
    def is_qwen35(self) -> bool:
        return self.model_type.startswith("qwen3_5")

    @property
    def is_qwen3_next(self) -> bool:
        """Qwen3-Next: Qwen3.5-MoE's layers, with the GDN input projections packed per key head in HF."""
        return self.model_type == "qwen3_next"

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
