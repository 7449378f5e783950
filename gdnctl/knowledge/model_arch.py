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
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
# Qwen's image processor normalises with these (preprocessor_config.json of the released Qwen3.5 checkpoints).
QWEN_IMAGE_MEAN = (0.5, 0.5, 0.5)
QWEN_IMAGE_STD = (0.5, 0.5, 0.5)


class VisionArch(BaseModel):
    """The vision tower of a vision-language checkpoint (config.json's `vision_config` and its image token ids) and
    how its image processor cuts an image (preprocessor_config.json, or the catalog for random weights).

    An image of w x h pixels is resized to within [min_pixels, max_pixels], both sides to multiples of
    patch_size x spatial_merge_size; its patches (patch_size^2 pixels, temporal_patch_size frames: a still image is
    repeated) go through `depth` blocks, and each spatial_merge_size^2 of them become one `image_token_id` in the
    language model's input, between `vision_start_token_id` and `vision_end_token_id`."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    depth: Size
    hidden_size: Size
    intermediate_size: Size
    num_heads: Size
    patch_size: Size
    temporal_patch_size: Size
    spatial_merge_size: Size
    out_hidden_size: Size
    num_position_embeddings: Size
    in_channels: Size = 3
    image_token_id: TokenId
    video_token_id: TokenId
    vision_start_token_id: TokenId
    vision_end_token_id: TokenId
    min_pixels: Size
    max_pixels: Size
    image_mean: tuple[float, float, float] = QWEN_IMAGE_MEAN
    image_std: tuple[float, float, float] = QWEN_IMAGE_STD

    @property
    def pixels_per_token(self) -> int:
        """Pixels of the resized image behind one image token (a merged block of patches)."""
        return (self.patch_size * self.spatial_merge_size) ** 2

    def tokens_for_pixels(self, pixels: int) -> int:
        """Image tokens of an image of `pixels` pixels once resized into the processor's bounds (rounded up)."""
        kept = min(max(pixels, self.min_pixels), self.max_pixels)
        return -(-kept // self.pixels_per_token)

    def preprocessor_config(self) -> dict:
        """preprocessor_config.json of the image processor these settings describe, in the keys transformers 5 writes
        for Qwen-VL's (what catalog.from_checkpoint reads back)."""
        return {
            "image_processor_type": "Qwen2VLImageProcessor",
            "size": {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "merge_size": self.spatial_merge_size,
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
        }

    def params(self) -> int:
        """Parameters of the tower: patch embedding, position embedding, `depth` blocks (two layer norms, QKV,
        output projection, a two-layer MLP, with biases), and the merger (a norm and a two-layer MLP from the
        merged patches to the language model's width)."""
        h, i = self.hidden_size, self.intermediate_size
        patch = self.in_channels * self.temporal_patch_size * self.patch_size**2 * h + h
        block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
        merged = h * self.spatial_merge_size**2
        merger = 2 * h + (merged * merged + merged) + (merged * self.out_hidden_size + self.out_hidden_size)
        return patch + self.num_position_embeddings * h + self.depth * block + merger


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
    # The vision tower of a vision-language class; None: the model reads text only.
    vision: VisionArch | None = None
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
