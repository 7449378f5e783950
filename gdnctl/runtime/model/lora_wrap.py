"""megatron-bridge's LoRA on the model the megatron-bridge builder built: the base frozen, the adapters the only
parameters that require a gradient, so that Megatron's DDP and optimizer hold nothing else.

What this rests on, read in megatron-bridge 0.6.2 (megatron/bridge/) and megatron-core 0.19.2 (megatron/core/):
- peft/lora.py LoRA (lines 49-115): `target_modules`, `dim` (the rank), `alpha`, `dropout` (before lora_A:
  dropout_position "pre"), lora_A xavier-initialised and lora_B zero, so the adapted model starts equal to the base;
  `share_expert_adapters=False` gives every grouped (TE grouped-GEMM) expert its own adapter
  (GroupedExpertLinearAdapter, lines 163-182), the layout the Hugging Face adapter holds (TRN018); True (its
  default, train.lora.expert_adapters: shared) one ParallelLinearAdapter for all of a grouped linear's experts,
  taken with one expert-parallel rank only (TRN024).
- peft/base.py PEFT.__call__ (lines 84-132): freezes every parameter (freeze_model, lines 176-202:
  requires_grad False), then wraps each matched module (LoRALinear: `to_wrap` is the base linear, `adapter` holds
  linear_in = lora_A and linear_out = lora_B, created after the freeze and so trainable), and puts the chunks in
  training mode.
- training/setup.py (lines 340-342, 581-661): megatron-bridge's own finetune loads the pretrained weights into the
  bare model and applies the LoRA in a pre-wrap hook, that is before DDP and the optimizer are built; gdnctl's
  trainer keeps that order (runtime/train/trainer.py).
- megatron-core distributed/distributed_data_parallel.py lines 114-116 and optimizer/__init__.py lines 329-331:
  DDP allocates gradient buffer space, and the optimizer builds parameter groups, only for parameters with
  requires_grad, so the frozen base has neither gradients nor Adam state (plan/memory.py counts it so).
- Transformer Engine 2.20.2 touches a weight's `main_grad` (the DDP buffer weight-gradient fusion adds into) only
  when the weight requires a gradient (transformer_engine/pytorch/module/linear.py lines 1077-1085 and 1168,
  layernorm_linear.py line 542, grouped_linear.py line 582), so the frozen base linears need no gradient buffer
  even with gradient_accumulation_fusion; megatron-core's finalize_model_grads skips a frozen tied embedding
  (distributed/finalize_model_grads.py lines 250-257: "When the embedding is frozen, the grad is None").
- peft/utils.py ParallelLinearAdapter.__init__ (lines 1006-1053): lora_A and lora_B are Megatron-Core's own
  ColumnParallelLinear / RowParallelLinear, built with the wrapped linear's config, so with
  gradient_accumulation_fusion and no APEX they meet the same build-time check as the output layer
  (runtime/model/wgrad_fusion.py): the builder applies the LoRA under the same guard and unfuses them after.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gdnctl.runtime.model.megatron_config import ModelBuildError
from gdnctl.schema import EngineLora

# Where megatron-bridge keeps an adapter's parameters: LoRALinear.adapter (peft/adapter_wrapper.py), whose
# linear_in / linear_out are lora_A / lora_B; its export skips exactly these names as not base weights
# (models/conversion/peft_bridge.py _is_adapter_param_name, line 154).
ADAPTER_MARK = ".adapter."


def is_adapter_parameter(name: str) -> bool:
    return ADAPTER_MARK in f".{name}"


@dataclass(frozen=True)
class Trainable:
    """What requires a gradient on this rank once the LoRA is applied."""

    adapter_names: tuple[str, ...]
    adapter_params: int
    frozen_params: int

    def line(self) -> str:
        return (
            f"LoRA: {self.adapter_params / 1e6:.2f}M adapter parameters train on this rank "
            f"({len(self.adapter_names)} tensors); {self.frozen_params / 1e6:.1f}M base parameters frozen"
        )


def trainable(parameters: Iterable[tuple[str, bool, int]]) -> Trainable:
    """Check (name, requires_grad, numel) of every parameter after the LoRA: adapters and only adapters train.

    A rank of a pipeline stage may hold no targeted linear (a stage of GDN layers alone with targets on the
    attention layers), so no adapter on a rank is not an error here; the trainer checks that some rank has one."""
    adapters, adapter_params, frozen = [], 0, 0
    base_training, adapters_frozen = [], []
    for name, requires_grad, numel in parameters:
        adapter = is_adapter_parameter(name)
        if adapter and requires_grad:
            adapters.append(name)
            adapter_params += numel
        elif adapter:
            adapters_frozen.append(name)
        elif requires_grad:
            base_training.append(name)
        else:
            frozen += numel
    if base_training:
        raise ModelBuildError(
            f"megatron-bridge's LoRA left base parameters trainable ({_some(base_training)}), so "
            "train.lora would update the base; use the megatron-bridge version the preset's "
            "runtime.megatron_bridge names."
        )
    if adapters_frozen:
        raise ModelBuildError(
            f"megatron-bridge's LoRA built frozen adapters ({_some(adapters_frozen)}), so "
            "train.lora would train nothing; use the megatron-bridge version the preset's "
            "runtime.megatron_bridge names."
        )
    return Trainable(tuple(adapters), adapter_params, frozen)


def _some(names: list[str], shown: int = 3) -> str:
    """The first names, and `...` when there are more."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def make_lora(spec: EngineLora):
    """megatron-bridge's LoRA for the engine config's train.lora (needs Transformer Engine: peft/lora_layers.py
    imports it)."""
    from megatron.bridge.peft.lora import LoRA

    return LoRA(
        target_modules=list(spec.target_modules),
        dim=spec.rank,
        alpha=spec.alpha,
        dropout=spec.dropout,
        share_expert_adapters=spec.share_expert_adapters,
    )


def apply_lora(model, spec: EngineLora) -> Trainable:
    """Freeze `model` (one bare chunk, not yet under DDP) and wrap its targeted linears in place; returns what
    trains on this rank."""
    lora = make_lora(spec)
    lora([model], training=True)
    return trainable((name, param.requires_grad, param.numel()) for name, param in model.named_parameters())
