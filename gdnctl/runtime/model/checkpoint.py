"""HF safetensors checkpoints of a Megatron-Core model, plus what a resume needs beside the weights.

Megatron's distributed checkpoints do not support the GDN tensors, and HF safetensors are what vLLM and every
other tool read, so the trainer saves those. A checkpoint directory holds:

    config.json                       HF config of the text model (Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM)
    model-RANK.safetensors            the tensors one writer rank holds (gathered over tensor parallel)
    model.safetensors.index.json      tensor name -> file
    trainer_state.json                iteration and consumed samples
    optimizer/rank-RANK.pt            each rank's optimizer state (fp32 main params and Adam moments)

`save_dir/latest` names the newest complete checkpoint; it is replaced only after every rank has finished
writing, so a job killed while saving leaves the previous checkpoint as the one a restart resumes from.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.errors import GdnctlError
from gdnctl.knowledge import ModelArch
from gdnctl.runtime.model.hf_weights import (
    Rule,
    ShardPlace,
    UnknownParameter,
    canonical_hf_name,
    group_rank_and_size,
    rules_for,
)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
STATE_FILE = "trainer_state.json"
LATEST = "latest"


class CheckpointError(GdnctlError):
    """A checkpoint cannot be read or does not match the model."""


@dataclass(frozen=True)
class Groups:
    """The process groups the shards of a parameter live in, and who writes what.

    `writes_dense`: this rank writes the non-expert tensors of its pipeline stage (tp rank 0 of dp/cp rank 0);
    `writes_experts`: it writes the experts of its expert-parallel rank (etp rank 0 of expert-dp rank 0)."""

    tp: object
    etp: object
    writes_dense: bool
    writes_experts: bool


def _is_expert(name: str) -> bool:
    return ".experts.local_experts." in name


def _named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    module = getattr(model, "module", model)  # under Megatron's DDP wrapper
    return list(module.named_parameters())


def _parameter_rules(model, arch: ModelArch, place: ShardPlace) -> list[tuple[str, torch.nn.Parameter, Rule]]:
    named = _named_parameters(model)
    if arch.tie_word_embeddings:
        # A later pipeline stage keeps its own copy of the tied embedding; HF stores it once.
        named = [(name, param) for name, param in named if name != "output_layer.weight"]
    try:
        rules = rules_for(arch, [name for name, _ in named], place)
    except UnknownParameter as error:
        raise CheckpointError(f"the model has a parameter gdnctl cannot map to HF names ({error.args[0]}); "
                              "this model variant is not supported by the HF checkpoint writer.") from None
    return [(name, param, rules[name]) for name, param in named]


def _gather(tensor: torch.Tensor, rule: Rule, groups: Groups, place: ShardPlace) -> list[torch.Tensor]:
    _, size = group_rank_and_size(rule, place)
    if size == 1:
        return [tensor]
    group = groups.tp if rule.group == "tp" else groups.etp
    shards = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(shards, tensor.contiguous(), group=group)
    return shards


def save_hf(model, arch: ModelArch, place: ShardPlace, groups: Groups, directory: Path,
            hf_config: dict) -> None:
    """Write this rank's part of an HF checkpoint into `directory` (collective: every rank calls it)."""
    from safetensors.torch import save_file

    rank = dist.get_rank()
    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, param, rule in _parameter_rules(model, arch, place):
        shards = _gather(param.detach(), rule, groups, place)
        writes = groups.writes_experts if _is_expert(name) else groups.writes_dense
        if writes:
            for hf_name, tensor in rule.to_hf(shards).items():
                tensors[hf_name] = tensor.to("cpu", copy=True).contiguous()
    file_name = f"model-{rank:05d}.safetensors"
    if tensors:
        save_file(tensors, str(directory / file_name), metadata={"format": "pt"})
    names = {name: file_name for name in tensors}
    everyone: list[dict[str, str]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, names)
    if rank == 0:
        weight_map = {name: file for part in everyone for name, file in part.items()}
        _write_json(directory / INDEX_FILE, {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))})
        _write_json(directory / "config.json", hf_config)


class HFReader:
    """Tensors of an HF checkpoint directory by their text-model names (vision-language prefixes removed)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        index = directory / INDEX_FILE
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif (directory / SINGLE_FILE).exists():
            from safetensors import safe_open

            with safe_open(str(directory / SINGLE_FILE), framework="pt") as handle:
                weight_map = {name: SINGLE_FILE for name in handle.keys()}
        else:
            raise CheckpointError(f"{directory} has neither {INDEX_FILE} nor {SINGLE_FILE}; model.path must be "
                                  "an HF checkpoint directory with safetensors weights.")
        self.locations = {}
        for name, file in weight_map.items():
            canonical = canonical_hf_name(name)
            if canonical is not None:
                self.locations[canonical] = (file, name)
        self._handles: dict[str, object] = {}

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self.locations:
            raise CheckpointError(f"{self.directory} has no tensor {name}; is it a Qwen3.5 checkpoint of the "
                                  "architecture the preset names?")
        file, stored = self.locations[name]
        if file not in self._handles:
            self._handles[file] = safe_open(str(self.directory / file), framework="pt")
        return self._handles[file].get_tensor(stored)


def load_hf(model, arch: ModelArch, place: ShardPlace, directory: Path) -> int:
    """Copy this rank's shards out of an HF checkpoint into the model's parameters; returns how many."""
    reader = HFReader(directory)
    loaded = 0
    with torch.no_grad():
        for name, param, rule in _parameter_rules(model, arch, place):
            rank, size = group_rank_and_size(rule, place)
            source = {hf_name: reader.get(hf_name) for hf_name in rule.hf_names}
            shard = rule.to_local(source, rank, size)
            if shard.shape != param.shape:
                raise CheckpointError(f"{directory}: {', '.join(rule.hf_names)} gives {name} the shape "
                                      f"{tuple(shard.shape)}, but the model has {tuple(param.shape)}; the "
                                      "checkpoint's architecture differs from the preset's.")
            param.copy_(shard.to(param.dtype))
            loaded += 1
    return loaded


def hf_text_config(arch: ModelArch) -> dict:
    """config.json of the text-only HF class matching the architecture (what vLLM >= 0.27 serves for Qwen3.5;
    Qwen3-Next has only the one class, Qwen3NextForCausalLM, which shares Qwen3.5's config keys)."""
    from gdnctl.knowledge import HF_CONFIG_KEYS, ROPE_KEYS

    moe = arch.is_moe
    # The keys the catalog reads from a config.json, written back from the architecture (dense models have no
    # expert fields, MoE models no dense intermediate size: those are None and left out).
    config = {key: getattr(arch, field) for key, field in HF_CONFIG_KEYS.items()
              if key not in ROPE_KEYS and getattr(arch, field) is not None}
    if arch.is_qwen3_next:
        architecture, model_type = "Qwen3NextForCausalLM", arch.model_type
    else:
        architecture = "Qwen3_5MoeForCausalLM" if moe else "Qwen3_5ForCausalLM"
        model_type = "qwen3_5_moe_text" if moe else "qwen3_5_text"
    config.update({
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_act": "silu", "tie_word_embeddings": arch.tie_word_embeddings, "attention_bias": False,
        "layer_types": ["linear_attention" if arch.layer_is_gdn(i) else "full_attention"
                        for i in range(arch.num_layers)],
        "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope_theta,
                            "partial_rotary_factor": arch.partial_rotary_factor},
        # The MTP head is not trained or written by this trainer.
        "mtp_num_hidden_layers": 0, "torch_dtype": "bfloat16",
    })
    if moe:
        config.update(shared_expert_intermediate_size=arch.shared_expert_ffn_hidden_size or 0,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    return config


# --- resume state ----------------------------------------------------------------------------------------

def _sub_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def optimizer_state(optimizer) -> list[dict]:
    """Each sub-optimizer's state on this rank: its state dict, and for a distributed optimizer the fp32 main
    params and moments of this rank's shard (Megatron keeps those out of state_dict())."""
    states = []
    for sub in _sub_optimizers(optimizer):
        entry = {"state_dict": sub.state_dict()}
        if hasattr(sub, "get_parameter_state_dp_reshardable"):
            entry["param_state"] = sub.get_parameter_state_dp_reshardable()
        states.append(entry)
    return states


def load_optimizer_state(optimizer, states: list[dict]) -> None:
    subs = _sub_optimizers(optimizer)
    if len(states) != len(subs):
        raise CheckpointError(f"the checkpoint has {len(states)} optimizer states but this run builds "
                              f"{len(subs)}; resume with the parallel settings the checkpoint was saved with.")
    for sub, entry in zip(subs, states):
        sub.load_state_dict(entry["state_dict"])
        _unshare_step_counters(sub)
        if "param_state" in entry:
            param_state = entry["param_state"]
            # Integer keys are grad-buffer indices ({dtype: [bucket: [element]]}); the loader skips elements
            # marked as padding, which the saver never marks.
            for buffer_index in (key for key in param_state if isinstance(key, int)):
                for buckets in param_state[buffer_index].values():
                    for bucket in buckets:
                        for element in bucket:
                            element.setdefault("padding", False)
            sub.load_parameter_state_from_dp_reshardable(param_state)


def _unshare_step_counters(sub) -> None:
    """Give every parameter its own Adam step counter.

    Without Transformer Engine or apex, Megatron-Core's DistributedOptimizer.load_state_dict hands one step
    tensor to every parameter's state, and torch's AdamW increments each parameter's counter in place: the
    shared counter then advances once per parameter per step, so the bias correction after a resume is wrong
    (seen as a resumed loss curve leaving the uninterrupted one from the second step on)."""
    inner = getattr(sub, "optimizer", None)
    for state in getattr(inner, "state", {}).values():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            state["step"] = step.clone()


def save_training_state(directory: Path, optimizer, state: dict) -> None:
    rank = dist.get_rank()
    (directory / "optimizer").mkdir(parents=True, exist_ok=True)
    torch.save(optimizer_state(optimizer), directory / "optimizer" / f"rank-{rank:05d}.pt")
    if rank == 0:
        _write_json(directory / STATE_FILE, {**state, "world_size": dist.get_world_size()})


def mark_latest(save_dir: Path, name: str) -> None:
    """Point save_dir/latest at `name` atomically (rank 0, after a barrier that follows every write)."""
    _write_text(save_dir / LATEST, name + "\n")


def latest_checkpoint(save_dir: Path) -> Path | None:
    marker = save_dir / LATEST
    if not marker.exists():
        return None
    directory = save_dir / marker.read_text().strip()
    if not (directory / STATE_FILE).exists():
        raise CheckpointError(f"{marker} names {directory}, which has no {STATE_FILE}; the checkpoint is "
                              "incomplete: point latest at an earlier checkpoint directory or delete it.")
    return directory


def read_training_state(directory: Path, world_size: int) -> dict:
    state = json.loads((directory / STATE_FILE).read_text())
    if state.get("world_size") != world_size:
        raise CheckpointError(f"{directory} was saved by {state.get('world_size')} ranks but this run has "
                              f"{world_size}; resume with the same parallel settings.")
    return state


def load_training_state(directory: Path, optimizer, device: str = "cuda") -> None:
    path = directory / "optimizer" / f"rank-{dist.get_rank():05d}.pt"
    if not path.exists():
        raise CheckpointError(f"{path} is missing; the checkpoint was written by a different parallel layout.")
    load_optimizer_state(optimizer, torch.load(path, map_location=device, weights_only=False))


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def _write_json(path: Path, document: dict) -> None:
    _write_text(path, json.dumps(document, indent=2) + "\n")


def _write_text(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
