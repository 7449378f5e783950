"""LoRA adapters in Hugging Face names: from Megatron's tensor-parallel adapter shards, into the `peft` adapter
layout (adapter_config.json + adapter_model.safetensors), and merged into the base weights.

An adapter on a weight W (out x in) is A (rank x in) and B (out x rank); the adapted weight is
W + (alpha / rank) B A, as megatron-bridge scales its adapter's output (peft/utils.py ParallelLinearAdapter.forward,
0.6.2 line 1246) and as `peft` merges one (tuners/lora/layer.py Linear.get_delta_weight: lora_alpha / r). The
routed experts of transformers 5's Qwen3.5-MoE and Qwen3-Next are one 3-D parameter per projection
(mlp.experts.gate_up_proj, E x 2I x H; mlp.experts.down_proj, E x H x I); their adapter is one per expert, A
(E x rank x in) and B (E x out x rank).

Megatron-side shards (megatron-bridge 0.6.2 peft/utils.py ParallelLinearAdapter.__init__, lines 1006-1053): on a
column-parallel linear (linear_qkv, in_proj, linear_fc1) lora_A is a ColumnParallelLinear(in, rank) with
gather_output, so every rank computes with the whole A, and lora_B a ColumnParallelLinear(rank, out) cut by rows
as the weight is; on a row-parallel linear (linear_proj, out_proj, linear_fc2) lora_A is a RowParallelLinear cut
by columns as the weight is, and lora_B a gathered ColumnParallelLinear, so the whole B. A fused Megatron weight
(linear_qkv, in_proj, linear_fc1) is several HF weights; each gets the rows of B its weight has and the same A,
which gives each HF weight exactly its rows of the fused B A.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from gdnctl.runtime.model.durable_files import make_directory, write_json, write_safetensors
from gdnctl.runtime.model.hf_weights import Rule

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# `peft` saves and loads an adapter's tensors under the PeftModel's own prefix, without the adapter's name
# (peft/utils/save_and_load.py get_peft_model_state_dict / set_peft_model_state_dict).
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter of one HF weight: A (rank x in) and B (out x rank), or for a 3-D experts parameter one per
    expert, A (experts x rank x in) and B (experts x out x rank)."""

    a: torch.Tensor
    b: torch.Tensor

    def __post_init__(self) -> None:
        if (
            self.a.dim() != self.b.dim()
            or self.a.dim() not in (2, 3)
            or self.a.shape[-2] != self.b.shape[-1]
            or self.a.shape[:-2] != self.b.shape[:-2]
        ):
            raise ValueError(
                f"a LoRA adapter needs A (rank x in) and B (out x rank), per expert for experts; got A "
                f"{tuple(self.a.shape)} and B {tuple(self.b.shape)}"
            )

    @property
    def rank(self) -> int:
        return self.a.shape[-2]


def column_adapters(rule: Rule, a: torch.Tensor, b_shards: list[torch.Tensor]) -> dict[str, Adapter]:
    """HF adapters of a column-parallel Megatron linear: B's rows are the weight's rows, so the weight's rule
    (hf_weights.py, which reads only row positions) splits and reorders them; every HF weight keeps the whole A."""
    return {name: Adapter(a, b) for name, b in rule.to_hf(b_shards).items()}


def row_adapters(rule: Rule, a_shards: list[torch.Tensor], b: torch.Tensor) -> dict[str, Adapter]:
    """HF adapters of a row-parallel Megatron linear: A's columns are cut as the weight's are, B is whole."""
    return {name: Adapter(a, b) for name, a in rule.to_hf(a_shards).items()}


def delta(adapter: Adapter, alpha: float) -> torch.Tensor:
    """(alpha / rank) B A in fp32 (per expert for experts)."""
    return (alpha / adapter.rank) * (adapter.b.float() @ adapter.a.float())


def merge(base: torch.Tensor, adapter: Adapter, alpha: float) -> torch.Tensor:
    """base + (alpha / rank) B A, added in fp32 and returned in the base's dtype."""
    update = delta(adapter, alpha)
    if update.shape != base.shape:
        raise ValueError(
            f"a LoRA adapter of shape {tuple(update.shape)} (B A) cannot merge into a weight of shape "
            f"{tuple(base.shape)}"
        )
    return (base.float() + update).to(base.dtype)


def merged_state(
    base: Mapping[str, torch.Tensor], adapters: Mapping[str, Adapter], alpha: float
) -> dict[str, torch.Tensor]:
    """The base weights with every adapter merged into the weight of its name; the other tensors as they are."""
    missing = sorted(set(adapters) - set(base))
    if missing:
        raise KeyError(f"LoRA adapters name weights the base does not have: {', '.join(missing[:5])}")
    return {name: merge(tensor, adapters[name], alpha) if name in adapters else tensor for name, tensor in base.items()}


def peft_tensors(adapters: Mapping[str, Adapter]) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """(adapter_model.safetensors' tensors, target_modules, target_parameters) in `peft`'s layout.

    A 2-D adapter of `X.weight` is `base_model.model.X.lora_A.weight` / `lora_B.weight` on the module X, and the
    module's last name goes into target_modules. A 3-D one of parameter `P.name` is wrapped by `peft`'s
    ParamWrapper (target_parameters), which keeps A as (experts x rank) x in, experts outermost, and B as out x
    (rank x experts), experts innermost (tuners/lora/layer.py ParamWrapper.update_layer and get_delta_weight,
    peft 0.21.2); several wrapped parameters of one module nest, the parameters in sorted order from the outside
    in, each one a `.base_layer` deeper (as megatron-bridge writes them, models/conversion/peft_bridge.py
    _build_target_parameter_prefixes, 0.6.2)."""
    tensors: dict[str, torch.Tensor] = {}
    modules: set[str] = set()
    parameters: dict[str, list[str]] = defaultdict(list)
    for name, adapter in adapters.items():
        if adapter.a.dim() == 2:
            if not name.endswith(".weight"):
                raise ValueError(f"a 2-D LoRA adapter adapts a module's weight (NAME.weight), not {name}")
            module = name.removesuffix(".weight")
            tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = adapter.a.contiguous()
            tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = adapter.b.contiguous()
            modules.add(module.rsplit(".", 1)[-1])
        else:
            parent, _, parameter = name.rpartition(".")
            parameters[parent].append(parameter)
    target_parameters: set[str] = set()
    for parent, names in parameters.items():
        for depth, parameter in enumerate(sorted(names)):
            adapter = adapters[f"{parent}.{parameter}"]
            experts, rank, fan_in = adapter.a.shape
            prefix = f"{PEFT_PREFIX}{parent}" + ".base_layer" * depth
            tensors[f"{prefix}.lora_A.weight"] = adapter.a.reshape(experts * rank, fan_in).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = adapter.b.permute(1, 2, 0).reshape(-1, rank * experts).contiguous()
            # `peft` matches a target parameter by the end of its module's name plus the parameter's name.
            target_parameters.add(".".join(parent.split(".")[-2:] + [parameter]))
    return tensors, sorted(modules), sorted(target_parameters)


def adapter_config(
    rank: int,
    alpha: float,
    dropout: float,
    target_modules: list[str],
    target_parameters: list[str],
    base_model: str = "",
) -> dict:
    """adapter_config.json as `peft`'s LoraConfig reads it (the keys megatron-bridge 0.6.2 writes,
    models/conversion/peft_bridge.py build_adapter_config_dict). `peft` refuses dropout on target_parameters
    (ParamWrapper.update_layer), and dropout does nothing once training is over, so it is 0 there."""
    config: dict = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0 if target_parameters else dropout,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_dora": False,
        "use_rslora": False,
        "target_modules": target_modules,
    }
    if target_parameters:
        config["target_parameters"] = target_parameters
    return config


def write_adapter(
    directory: Path,
    adapters: Mapping[str, Adapter],
    alpha: float,
    dropout: float = 0.0,
    base_model: str = "",
    durable: bool = True,
) -> dict[str, dict]:
    """Write `directory`/adapter_config.json and adapter_model.safetensors, loadable with
    `peft.PeftModel.from_pretrained(hf_model, directory)`. Returns each file's size and checksum
    (durable_files)."""
    ranks = {adapter.rank for adapter in adapters.values()}
    if len(ranks) != 1:
        raise ValueError(f"the adapters of one LoRA checkpoint share one rank; got ranks {sorted(ranks)}")
    tensors, modules, parameters = peft_tensors(adapters)
    make_directory(directory)
    return {
        WEIGHTS_FILE: write_safetensors(directory / WEIGHTS_FILE, tensors, durable),
        CONFIG_FILE: write_json(
            directory / CONFIG_FILE,
            adapter_config(ranks.pop(), alpha, dropout, modules, parameters, base_model),
            durable,
        ),
    }
