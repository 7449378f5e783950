"""The Gated DeltaNet model families gdnctl runs, each described once.

A family is what a checkpoint's config.json `model_type` names: its HF classes (the vision-language class its
released checkpoints use, the text-only class gdnctl writes and trains), how HF stores its GDN input projection,
and from which release each part of the stack (transformers, megatron-bridge, vLLM, peft) handles it. The
catalog's entries and a checkpoint's config.json name a family by `model_type` (`family_of`); validate's rules,
explain, the weight-name rules, the checkpoint writer and the CPU policy read what they decide about a family from
its entry rather than comparing names. A new family (Qwen3.6, the next GDN model) is an entry here and the code
that is truly new for it; tests/test_model_families.py checks that no other module spells a family's model type or
HF class names.

Plain data: importing this imports nothing heavy (`gdnctl validate` reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

# How HF stores a GDN layer's input projection: Qwen3.5 as four linears (in_proj_qkv, in_proj_z, in_proj_b,
# in_proj_a); Qwen3-Next as two (in_proj_qkvz, in_proj_ba) whose rows are grouped per key head (transformers'
# Qwen3NextGatedDeltaNet.fix_query_key_value_ordering). runtime/model/hf_weights.py maps each to Megatron's one
# in_proj; LoRA's gdn_in target adapts these modules.
GdnInProjection = Literal["split", "per_key_head"]
GDN_IN_MODULES: Mapping[GdnInProjection, tuple[str, ...]] = {
    "split": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
    "per_key_head": ("in_proj_qkvz", "in_proj_ba"),
}


@dataclass(frozen=True)
class ModelFamily:
    name: str  # the model_type of its checkpoints' config.json (the top-level one for vision-language ones)
    label: str  # how sentences name it
    moe: bool
    # Its text-only class: transformers' config and model classes (the CPU policy builds them), and the
    # model_type of their config.json (a vision-language checkpoint's text_config carries it too).
    text_model_type: str
    text_config_class: str
    text_class: str
    # The class of its released checkpoints when they are vision-language (the language model under
    # `model.language_model.`, a vision tower beside it); None: its checkpoints are text-only.
    vision_language_class: str | None
    gdn_in_projection: GdnInProjection
    # transformers: the first release with its classes (TRN003 for the CPU policy).
    transformers_since: str
    # megatron-bridge: the first release with a bridge for its vision-language and its text-only class (BRG003),
    # and the first whose provider takes TP above the KV heads (HEAD002); None: gdnctl does not check it.
    bridge_vision_language_since: str | None
    bridge_text_since: str | None
    bridge_tp_above_kv_heads_since: str | None
    bridge_lora: bool  # megatron-bridge trains LoRA on it (TRN020)
    # peft loads a shared expert's LoRA adapter as the routed experts' fused parameters (TRN019).
    peft_fuses_shared_expert_adapter: bool
    # vLLM: the first release that registers its text-only class (before it gdnctl serves the vision-language
    # class with no tower: plan/decisions.rollout_class), and the first release gdnctl served that
    # vision-language class on (RLT015); None: vLLM serves the text-only class from the first release gdnctl
    # supports.
    vllm_text_class_since: str | None
    vllm_vision_language_checked: str | None

    @property
    def model_types(self) -> tuple[str, ...]:
        """Every model_type a config.json of this family may carry (top level, or its text_config's)."""
        return tuple(dict.fromkeys((self.name, self.text_model_type)))

    @property
    def hf_classes(self) -> tuple[str, ...]:
        return tuple(name for name in (self.vision_language_class, self.text_class) if name is not None)

    @property
    def gdn_in_modules(self) -> tuple[str, ...]:
        """The HF modules (last names) of a GDN layer's input projection."""
        return GDN_IN_MODULES[self.gdn_in_projection]


# Sources, for every version below:
# - transformers: models/qwen3_next is in 4.57.0, not 4.56.2 (release notes "v4.57.0: Qwen3-Next, ..."; PyPI yanked
#   4.57.0 for a setup error, so 4.57.1 is the first that installs); models/qwen3_5 and qwen3_5_moe (their *_text
#   configs, Qwen3_5ForCausalLM and Qwen3_5MoeForCausalLM too) are in 5.2.0, absent from 5.1.0's wheel. verl #5937
#   is the failure: "model type qwen3_5 but Transformers does not recognize this architecture".
# - megatron-bridge: Qwen35VLBridge / Qwen35VLMoEBridge from v0.4.0, Qwen35Bridge / Qwen35MoEBridge (text-only
#   classes) from v0.5.0; 0.4.x's Qwen3.5 providers refuse TP > query groups (PR #3238, fixed in 0.5.0). Its
#   Qwen3-Next PEFT recipe raises NotImplementedError from v0.3.1 to 0.6.2 (recipes/qwen/h100/qwen3_next.py lines
#   296-314, commit 7e7084fa7).
# - peft 0.21.2 peft/utils/transformers_weight_conversion.py _convert_peft_config_moe maps qwen3_next to the
#   qwen2_moe pattern (gate_proj, up_proj -> gate_up_proj; down_proj -> down_proj).
# - vLLM: Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM registered from 0.27.0; before that only the vision-language
#   classes (vllm/model_executor/models/registry.py), which gdnctl ran from 0.26.0 (tests/gpu/test_rl_vllm_gpu.py on
#   an H100).
QWEN3_5 = ModelFamily(
    name="qwen3_5",
    label="Qwen3.5",
    moe=False,
    text_model_type="qwen3_5_text",
    text_config_class="Qwen3_5TextConfig",
    text_class="Qwen3_5ForCausalLM",
    vision_language_class="Qwen3_5ForConditionalGeneration",
    gdn_in_projection="split",
    transformers_since="5.2.0",
    bridge_vision_language_since="0.4.0",
    bridge_text_since="0.5.0",
    bridge_tp_above_kv_heads_since="0.5.0",
    bridge_lora=True,
    peft_fuses_shared_expert_adapter=False,
    vllm_text_class_since="0.27.0",
    vllm_vision_language_checked="0.26.0",
)

# Qwen3.5's MoE sizes: the same stack support, its own classes.
QWEN3_5_MOE = replace(
    QWEN3_5,
    name="qwen3_5_moe",
    label="Qwen3.5-MoE",
    moe=True,
    text_model_type="qwen3_5_moe_text",
    text_config_class="Qwen3_5MoeTextConfig",
    text_class="Qwen3_5MoeForCausalLM",
    vision_language_class="Qwen3_5MoeForConditionalGeneration",
)

QWEN3_NEXT = ModelFamily(
    name="qwen3_next",
    label="Qwen3-Next",
    moe=True,
    text_model_type="qwen3_next",
    text_config_class="Qwen3NextConfig",
    text_class="Qwen3NextForCausalLM",
    vision_language_class=None,
    gdn_in_projection="per_key_head",
    transformers_since="4.57.0",
    bridge_vision_language_since=None,
    bridge_text_since=None,
    bridge_tp_above_kv_heads_since=None,
    bridge_lora=False,
    peft_fuses_shared_expert_adapter=True,
    vllm_text_class_since=None,
    vllm_vision_language_checked=None,
)

MODEL_FAMILIES: Mapping[str, ModelFamily] = {family.name: family for family in (QWEN3_5, QWEN3_5_MOE, QWEN3_NEXT)}
_BY_MODEL_TYPE: Mapping[str, ModelFamily] = {
    model_type: family for family in MODEL_FAMILIES.values() for model_type in family.model_types
}


def family_of(model_type: str) -> ModelFamily | None:
    """The family a config.json's model_type names; None for a model gdnctl does not run."""
    return _BY_MODEL_TYPE.get(model_type)


def known_model_types() -> str:
    """The model types gdnctl runs, for a sentence."""
    return ", ".join(_BY_MODEL_TYPE)


def bridge_features() -> tuple[tuple[str, str], ...]:
    """(first megatron-bridge release, what it bridges) of every family's classes, each label once: what doctor
    reports of an installed megatron-bridge."""
    features: dict[str, str] = {}
    for family in MODEL_FAMILIES.values():
        group = family.label.split("-")[0]  # Qwen3.5 and Qwen3.5-MoE arrived together
        for since, kind in ((family.bridge_vision_language_since, "VL"), (family.bridge_text_since, "text")):
            if since is not None:
                features.setdefault(f"{group} {kind}", since)
    return tuple((since, label) for label, since in features.items())
