"""LoRA targets: the readable names a preset's train.lora.targets takes, what each one wraps in Megatron-Core's
Qwen3.5 / Qwen3-Next model (as megatron-bridge's PEFT matches it) and in the Hugging Face model (as `peft` names
it), and how many adapter parameters each adds.

What this rests on, read in megatron-bridge 0.6.2 (NVIDIA-NeMo/Megatron-Bridge, the wheel's megatron/bridge/) and
megatron-core 0.19.2 (NVIDIA/Megatron-LM, megatron/core/):
- `peft/lora.py` LoRA (lines 49-219): a dataclass with `target_modules` (default linear_qkv, linear_proj,
  linear_fc1, linear_fc2), `dim` (32), `alpha` (32), `dropout` (0.0, applied before lora_A: dropout_position
  "pre"), `lora_A_init_method` xavier and `lora_B_init_method` zero, and `share_expert_adapters` (True: one adapter
  shared by all of an EP rank's grouped experts; False: one per expert, GroupedExpertLinearAdapter). Its
  `transform` wraps a matched module in LoRALinear(module, ParallelLinearAdapter(in, out, dim)).
- `peft/module_matcher.py` ModuleMatcher.match (lines 94-165): a target matches a module when it equals the
  module's attribute name or, with `*` wildcards, its full dotted name; a target that matches nothing is only a
  warning ("No modules matched the requested target_modules entries", `_validate_target_matches`, lines 195-209).
  So the bare names linear_fc1/linear_fc2 wrap the dense MLP, the routed experts and the shared expert alike; the
  patterns below tell them apart by their full names.
- `peft/utils.py` wildcard_match (lines 722-744): `*` becomes `(.*)` and the pattern is anchored at both ends (its
  dots stay regex dots); `wildcard_match` here is the same function, so the tests check the patterns against the
  Megatron names gdnctl's own checkpoint code uses.
- `peft/utils.py` get_adapter_attributes_from_linear (lines 522-652): the wrappable linears are Transformer
  Engine's (TEColumnParallelLinear, TELayerNormColumnParallelLinear, TEColumnParallelGroupedLinear,
  TERowParallelLinear, TERowParallelGroupedLinear, TELinear), Megatron-Core's ColumnParallelLinear and
  RowParallelLinear, and the MoE TopKRouter; anything else raises "Layer type is unrecognized for LoRA".
- `peft/utils.py` is_expert_linear / is_grouped_expert_linear (lines 655-679): `...mlp.*experts*.linear_fc1|2`
  outside `.shared_experts.` is an expert linear; one outside `.local_experts.` is a grouped (TE grouped-GEMM) one.
- `peft/utils.py` ParallelLinearAdapter.forward (line 1246) and GroupedExpertLinearAdapter (lines 2304, 2313): the
  adapter's output is scaled by alpha / dim, as `peft`'s LoRA scales by lora_alpha / r.
- `peft/utils.py` lines 1267-1322: a shared adapter on a grouped expert linear (share_expert_adapters True) is
  broadcast from EP rank 0 when built and its gradients are all-reduced over the EP group (from v0.6.0, PR #5396;
  gdnctl takes it with one EP rank only, TRN024), and `models/conversion/peft_bridge.py`
  `_select_expert_adapter_weight` (lines 529-546) exports a 2-D (shared) adapter as every expert's, so the Hugging
  Face adapter holds it once per expert.
- `peft/lora_layers.py` line 20: `import transformer_engine.pytorch as te` at module level, so megatron-bridge's
  LoRA cannot be imported where Transformer Engine is not installed.
- `recipes/qwen_vl/h100/qwen35_vl.py` (every qwen35_vl_*_peft_* config, e.g. lines 1263-1272):
  `default_peft_config("lora")`, which is `LoRA()` with the default target_modules (recipes/utils/dataset_utils.py
  lines 46-75). Qwen3-Next has no LoRA recipe: `recipes/qwen/h100/qwen3_next.py` lines 296-314 raise
  NotImplementedError("PEFT is not currently supported for Qwen3-Next models", since v0.3.1; TRN020). On Qwen3.5
  these names match the gated-attention
  layers' linear_qkv and linear_proj and every linear_fc1/linear_fc2 (dense MLP, routed and shared experts), and
  not the GDN layers: GatedDeltaNet's projections are `in_proj` and `out_proj` (megatron-core 0.19.2
  models/gpt/experimental_attention_variant_module_specs.py lines 60-78: TE's column-parallel layer-norm linear
  and row-parallel linear). DEFAULT_TARGETS is that coverage.
- `models/conversion/peft_bridge.py` (lines 93-97, 263-271, 1433-1631): megatron-bridge's own HF adapter export
  renames linear_in/linear_out to lora_A/lora_B, splits a GDN in_proj adapter over in_proj_qkv/z/b/a only when the
  HF names are Qwen3.5's, writes 3-D expert adapters as `peft` target_parameters, and builds adapter_config.json
  with peft_type LORA, r, lora_alpha, lora_dropout and target_modules (`build_adapter_config_dict`).

The Hugging Face names are transformers 5's Qwen3.5 and Qwen3-Next classes (models/qwen3_5*/, qwen3_next/): gated
attention self_attn.{q,k,v,o}_proj (q_proj holds each head's query and output gate), GDN linear_attn.in_proj_qkv,
in_proj_z, in_proj_b, in_proj_a (Qwen3-Next: in_proj_qkvz, in_proj_ba) and linear_attn.out_proj, the dense MLP and
the shared expert {gate,up,down}_proj, and the routed experts as 3-D parameters mlp.experts.gate_up_proj and
mlp.experts.down_proj (one tensor per layer, not one module per expert), which `peft` adapts through
target_parameters. gdnctl's Megatron <-> HF weight rules are in gdnctl/runtime/model/hf_weights.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gdnctl.knowledge.model_arch import ModelArch

LoraTargetName = Literal["attention_qkv", "attention_out", "gdn_in", "gdn_out", "mlp", "shared_expert", "experts"]
# Where a target's linears are: in the gated-attention layers, the GDN layers, or every layer's MLP block.
Layers = Literal["attention", "gdn", "mlp"]
# What the model needs for the target to exist: nothing, a dense MLP, routed experts, a shared expert.
Needs = Literal["any", "dense", "moe", "shared_expert"]


@dataclass(frozen=True)
class LoraTarget:
    name: LoraTargetName
    what: str
    # megatron-bridge LoRA target_modules patterns (full Megatron module names, `*` wildcards).
    megatron: tuple[str, ...]
    # The HF modules it adapts (the leaf names `peft` puts in target_modules) or, for the routed experts, the HF
    # parameters (`peft` target_parameters).
    hf_modules: tuple[str, ...]
    hf_parameters: tuple[str, ...]
    layers: Layers
    needs: Needs


TARGETS: dict[str, LoraTarget] = {
    target.name: target
    for target in (
        LoraTarget(
            "attention_qkv",
            "the gated-attention layers' fused query, gate, key and value projection",
            ("*.self_attention.linear_qkv",),
            ("q_proj", "k_proj", "v_proj"),
            (),
            "attention",
            "any",
        ),
        LoraTarget(
            "attention_out",
            "the gated-attention layers' output projection",
            ("*.self_attention.linear_proj",),
            ("o_proj",),
            (),
            "attention",
            "any",
        ),
        LoraTarget(
            "gdn_in",
            "the GDN layers' fused input projection (q, k, v, z, beta, alpha)",
            ("*.self_attention.in_proj",),
            ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
            (),
            "gdn",
            "any",
        ),
        LoraTarget(
            "gdn_out",
            "the GDN layers' output projection",
            ("*.self_attention.out_proj",),
            ("out_proj",),
            (),
            "gdn",
            "any",
        ),
        LoraTarget(
            "mlp",
            "the dense MLP's gate-and-up and down projections",
            ("*.mlp.linear_fc1", "*.mlp.linear_fc2"),
            ("gate_proj", "up_proj", "down_proj"),
            (),
            "mlp",
            "dense",
        ),
        LoraTarget(
            "shared_expert",
            "the MoE shared expert's gate-and-up and down projections",
            ("*.mlp.shared_experts.linear_fc1", "*.mlp.shared_experts.linear_fc2"),
            ("gate_proj", "up_proj", "down_proj"),
            (),
            "mlp",
            "shared_expert",
        ),
        # One adapter for all of a layer's experts (train.lora.expert_adapters: shared, megatron-bridge's own
        # default) or one per expert (per_expert, LoRA(share_expert_adapters=False), TRN018); plan/decisions.py
        # lora_expert_adapters picks between them.
        LoraTarget(
            "experts",
            "every routed expert's gate-and-up and down projections",
            ("*.mlp.experts.linear_fc1", "*.mlp.experts.linear_fc2"),
            (),
            ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
            "mlp",
            "moe",
        ),
    )
}
# gdn_in's HF modules are the family's (model_families.GDN_IN_MODULES): Qwen3-Next packs the same rows per key head
# into two linears (hf_weights.py), and megatron-bridge's adapter export splits a GDN in_proj adapter only into
# Qwen3.5's four (peft_bridge.py _is_gdn_in_proj_split, lines 263-271), so gdnctl splits it by its own rule
# (runtime/model/lora_adapters.py).

# megatron-bridge's Qwen3.5 LoRA recipes' coverage (LoRA() defaults): every linear but the GDN layers'.
DEFAULT_TARGETS: tuple[LoraTargetName, ...] = ("attention_qkv", "attention_out", "mlp", "shared_expert", "experts")


def has_target(model: ModelArch, name: str) -> bool:
    """Whether the model has the linears a target names."""
    needs = TARGETS[name].needs
    if needs == "dense":
        return not model.is_moe
    if needs == "moe":
        return model.is_moe
    if needs == "shared_expert":
        return model.is_moe and bool(model.shared_expert_ffn_hidden_size)
    return True


def hf_modules(model: ModelArch, name: str) -> tuple[str, ...]:
    """The HF modules (last names) a target adapts in this model's transformers class."""
    if name == "gdn_in":
        return model.family.gdn_in_modules
    return TARGETS[name].hf_modules


def default_targets(model: ModelArch) -> tuple[LoraTargetName, ...]:
    """DEFAULT_TARGETS that the model has: megatron-bridge's LoRA() defaults match nothing else on it."""
    return tuple(name for name in DEFAULT_TARGETS if has_target(model, name))


def megatron_target_modules(names: tuple[str, ...]) -> list[str]:
    """megatron-bridge LoRA(target_modules=...) for the readable targets."""
    return [pattern for name in names for pattern in TARGETS[name].megatron]


def wildcard_match(pattern: str, name: str) -> bool:
    """megatron-bridge 0.6.2's wildcard_match (peft/utils.py lines 722-744), the same regex: `*` is `(.*)`, the
    pattern is anchored at both ends, its other characters (dots too) are regex as written."""
    return re.match("^" + pattern.replace("*", "(.*)") + "$", name) is not None


def linear_shapes(model: ModelArch, name: str, shared_experts: bool = False) -> tuple[tuple[int, int, int], ...]:
    """(in features, out features, adapters per layer) of each linear a target wraps in one layer of its kind, as
    megatron-bridge sizes the adapter: the whole (unsharded) linear, get_adapter_attributes_from_linear. The routed
    experts' linears have one adapter per expert, or one for them all with `shared_experts`."""
    m, h = model, model.hidden_size
    key_width = m.linear_num_key_heads * m.linear_key_head_dim
    value_width = m.linear_num_value_heads * m.linear_value_head_dim
    q_width = m.num_attention_heads * m.head_dim
    experts = 1 if shared_experts else (m.num_experts or 0)
    shapes = {
        "attention_qkv": ((h, 2 * q_width + 2 * m.num_key_value_heads * m.head_dim, 1),),
        "attention_out": ((q_width, h, 1),),
        "gdn_in": ((h, 2 * key_width + 2 * value_width + 2 * m.linear_num_value_heads, 1),),
        "gdn_out": ((value_width, h, 1),),
        "mlp": ((h, 2 * (m.ffn_hidden_size or 0), 1), (m.ffn_hidden_size or 0, h, 1)),
        "shared_expert": (
            (h, 2 * (m.shared_expert_ffn_hidden_size or 0), 1),
            (m.shared_expert_ffn_hidden_size or 0, h, 1),
        ),
        "experts": (
            (h, 2 * (m.moe_ffn_hidden_size or 0), experts),
            (m.moe_ffn_hidden_size or 0, h, experts),
        ),
    }
    return shapes[name]


def adapter_params_per_layer(model: ModelArch, name: str, rank: int, shared_experts: bool = False) -> int:
    """Adapter parameters a target adds to one layer of its kind: rank x (in + out) per wrapped linear (lora_A is
    rank x in, lora_B out x rank), times the experts for the routed experts' linears unless they share one."""
    return sum(
        rank * (fan_in + fan_out) * copies for fan_in, fan_out, copies in linear_shapes(model, name, shared_experts)
    )


def layers_of(model: ModelArch, layers: Layers) -> int:
    """How many layers hold a target of this kind."""
    return {"attention": model.num_full_attention_layers, "gdn": model.num_gdn_layers, "mlp": model.num_layers}[layers]


def adapter_params(model: ModelArch, names: tuple[str, ...], rank: int, shared_experts: bool = False) -> int:
    """Adapter parameters of the whole model (the MTP layer is not trained, TRN004) for these targets."""
    return sum(
        adapter_params_per_layer(model, name, rank, shared_experts) * layers_of(model, TARGETS[name].layers)
        for name in names
        if has_target(model, name)
    )
