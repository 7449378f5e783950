"""HF safetensors checkpoints of a Megatron-Core model, plus what a resume needs beside the weights.

Megatron's distributed checkpoints do not support the GDN tensors, and HF safetensors are what vLLM and every
other tool read, so the trainer saves those. A checkpoint directory holds:

    config.json                       the source checkpoint's config.json (passthrough.py), or for a run from
                                      random weights the text-only class's (Qwen3_5ForCausalLM / ...MoeForCausalLM)
    model-RANK.safetensors            the tensors one writer rank holds (gathered over tensor parallel)
    passthrough.safetensors           the source's tensors gdnctl does not train (MTP head, vision tower), unchanged
    model.safetensors.index.json      tensor name -> file
      (or model.safetensors alone)    the CPU rl policy's weights, which every rank holds whole, when nothing is
                                      carried over from a source
    optimizer/rank-RANK.pt            each rank's optimizer state (fp32 main params and Adam moments)
    trainer_state.json                iteration, consumed samples, and the size and sha256 of every file above

Every file is written to a temporary name, fsynced, renamed into place and its directory fsynced, so a file
under its real name is whole and on disk. trainer_state.json is written last, by rank 0 once every rank has
written its files, and `save_dir/latest` moves to the checkpoint only after that: a job killed (or a machine
losing power) at any moment of a save leaves `latest` naming the previous, complete checkpoint.

A resume checks the checkpoint `latest` names against its recorded sizes and checksums (the ranks share the
reading); one that fails (a disk error, a file truncated or edited since) gives way to the newest older
checkpoint that passes, with one line on stderr saying which and why.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import struct
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.errors import GdnctlError
from gdnctl.files import UnreadableFile, read_json
from gdnctl.knowledge import ModelArch
from gdnctl.runtime.model.hf_weights import (
    VL_PREFIX,
    Rule,
    ShardPlace,
    UnknownParameter,
    canonical_hf_name,
    group_rank_and_size,
    rules_for,
)
from gdnctl.runtime.model.passthrough import PASSTHROUGH_FILE, HFSource, source_checkpoint, write_passthrough

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
STATE_FILE = "trainer_state.json"
CONFIG_FILE = "config.json"
OPTIMIZER_DIR = "optimizer"
LATEST = "latest"
CHECKPOINT_NAME = re.compile(r"iter_(\d+)")
# sha256 rather than a faster non-cryptographic hash: hashlib's sha256 runs on the CPU's SHA extensions (SHA-NI,
# on the x86 hosts of H100/H200 nodes) at ~1.6 GB/s per core in memory, measured on an AMD EPYC. Each rank hashes
# only the files it wrote, in parallel with the other ranks, right after writing them (so from the page cache):
# 0.8 s per GiB there, beside 1.2-3 s per GiB to write a safetensors file and 0.35 s to fsync it. That is a
# fraction of the save, not a multiple, and a sha256 can be checked by hand with `sha256sum`; zlib's crc32
# (3.5 GB/s) would save about half a second per GiB for a 32-bit check, and xxhash is not a dependency.
CHECKSUM = "sha256"
STATE_CHECKSUM = "state_sha256"  # trainer_state.json's own checksum, over its other keys

Files = dict[str, dict]  # path inside a checkpoint -> {"size": bytes, "sha256": hex digest}
# Bounds on the JSON files of a checkpoint a resume reads: config.json is a few KiB, the index of a 397B-A17B
# checkpoint (one line per tensor, about 100k tensors) about 10 MiB, trainer_state.json one line per file.
MAX_CONFIG_BYTES = 16 * 1024**2
MAX_INDEX_BYTES = 256 * 1024**2
MAX_STATE_BYTES = 256 * 1024**2


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


def save_hf(model, arch: ModelArch, place: ShardPlace, groups: Groups, directory: Path, source: HFSource, *,
            durable: bool = True) -> Files:
    """Write this rank's part of an HF checkpoint into `directory` (collective: every rank calls it), shaped
    like `source` (passthrough.py); returns the files this rank wrote, for save_training_state.

    durable=False (the rl job's per-step export, which the rollout reloads at once and the next step replaces)
    keeps the atomic renames but skips the fsyncs and checksums: a crash there loses nothing a resume needs."""
    rank = dist.get_rank()
    _make_directory(directory)
    tensors: dict[str, torch.Tensor] = {}
    for name, param, rule in _parameter_rules(model, arch, place):
        shards = _gather(param.detach(), rule, groups, place)
        writes = groups.writes_experts if _is_expert(name) else groups.writes_dense
        if writes:
            for hf_name, tensor in rule.to_hf(shards).items():
                tensors[source.stored_name(hf_name)] = tensor.to("cpu", copy=True).contiguous()
    file_name = _shard_file(rank)
    written: Files = {}
    if tensors:
        written[file_name] = _write_safetensors(directory / file_name, tensors, durable)
    names = {name: file_name for name in tensors}
    everyone: list[dict[str, str]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, names)
    if rank == 0:
        weight_map = {name: file for part in everyone for name, file in part.items()}
        written.update(_write_passthrough_index_and_config(directory, source, weight_map, durable))
    return written


def iter_hf(model, arch: ModelArch, place: ShardPlace, groups: Groups) -> Iterator[tuple[str, torch.Tensor]]:
    """Every HF tensor of the model, gathered over tensor parallel, on this rank's GPU (collective: every rank
    iterates). Whole on every rank only where no rank holds layers or experts that others lack: pp == ep == 1
    (plan/decisions.rollout_weight_transport sends other runs through the disk)."""
    for _, param, rule in _parameter_rules(model, arch, place):
        yield from rule.to_hf(_gather(param.detach(), rule, groups, place)).items()


def save_tensors(tensors: Iterable[tuple[str, torch.Tensor]], directory: Path, source: HFSource) -> Files:
    """Write HF-named tensors whole, shaped like `source` (passthrough.py): the weights of a policy that every
    rank holds in full (one rank calls it). Returns the files written, for save_training_state."""
    _make_directory(directory)
    prepared = {source.stored_name(name): tensor.detach().to("cpu").contiguous() for name, tensor in tensors}
    if not source.passthrough(prepared):
        return {SINGLE_FILE: _write_safetensors(directory / SINGLE_FILE, prepared, durable=True),
                CONFIG_FILE: _write_json(directory / CONFIG_FILE, source.config, durable=True)}
    # transformers reads model.safetensors alone whenever a directory has one, ignoring the index, so beside the
    # carried-over tensors the weights take a shard's name.
    file_name = _shard_file(0)
    written = {file_name: _write_safetensors(directory / file_name, prepared, durable=True)}
    return {**written, **_write_passthrough_index_and_config(directory, source, dict.fromkeys(prepared, file_name),
                                                             durable=True)}


def _shard_file(index: int) -> str:
    return f"model-{index:05d}.safetensors"


def _write_passthrough_index_and_config(directory: Path, source: HFSource, weight_map: dict[str, str],
                                        durable: bool) -> Files:
    """The last files of a save, written by one rank once the weights are: the source's tensors that the save
    did not write (PASSTHROUGH_FILE), the index naming every tensor's file, and the source's config.json."""
    written: Files = {}
    carried = source.passthrough(weight_map)
    if carried:
        written[PASSTHROUGH_FILE] = _write_file(directory / PASSTHROUGH_FILE, partial(write_passthrough, carried),
                                                durable)
        weight_map = {**weight_map, **dict.fromkeys(carried, PASSTHROUGH_FILE)}
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    written[INDEX_FILE] = _write_json(directory / INDEX_FILE, index, durable)
    written[CONFIG_FILE] = _write_json(directory / CONFIG_FILE, source.config, durable)
    return written


class ShardWriter:
    """An HF checkpoint written from a stream of whole HF-named tensors (the megatron-bridge export, which hands
    every rank every tensor): one rank adds them, a shard file is written each time `shard_bytes` fill up, and
    `close` writes what the save carries over from `source` (passthrough.py), the index and config.json and
    returns the files written, for save_training_state."""

    def __init__(self, directory: Path, source: HFSource, *, durable: bool, shard_bytes: int) -> None:
        _make_directory(directory)
        self.directory, self.source, self.durable, self.shard_bytes = directory, source, durable, shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.weight_map: dict[str, str] = {}
        self.written: Files = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.pending[self.source.stored_name(name)] = tensor.detach().to("cpu").contiguous()
        self.pending_bytes += tensor.numel() * tensor.element_size()
        if self.pending_bytes >= self.shard_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        file_name = _shard_file(len(self.written))
        self.written[file_name] = _write_safetensors(self.directory / file_name, self.pending, self.durable)
        self.weight_map.update((name, file_name) for name in self.pending)
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> Files:
        self._flush()
        self.written.update(_write_passthrough_index_and_config(self.directory, self.source, self.weight_map,
                                                                self.durable))
        return self.written


class HFReader:
    """Tensors of an HF checkpoint directory by their text-model names (vision-language prefixes removed)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.locations = {}
        for name, file in _weight_map(directory).items():
            canonical = canonical_hf_name(name)
            if canonical is not None:
                self.locations[canonical] = (file, name)
        self._handles: dict[str, object] = {}

    def get(self, name: str) -> torch.Tensor:
        from safetensors import SafetensorError, safe_open

        if name not in self.locations:
            raise CheckpointError(f"{self.directory} has no tensor {name}; is it a Qwen3.5 checkpoint of the "
                                  "architecture the preset names?")
        file, stored = self.locations[name]
        try:
            if file not in self._handles:
                self._handles[file] = safe_open(str(self.directory / file), framework="pt")
            return self._handles[file].get_tensor(stored)
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"{self.directory / file} cannot give tensor {stored} ({error}); "
                                  f"{_RESTORE}") from None


# The fix for a checkpoint directory whose files do not read back.
_RESTORE = "restore the checkpoint's files, or point model.path (or save_dir/latest) at a whole checkpoint"


def _weight_map(directory: Path) -> dict[str, str]:
    """Every tensor of an HF checkpoint directory by its stored name -> the safetensors file holding it, a file
    of the directory itself (a name with a path in it would read from elsewhere)."""
    from safetensors import SafetensorError, safe_open

    index = directory / INDEX_FILE
    if index.exists():
        try:
            document = read_json(index, MAX_INDEX_BYTES)
        except UnreadableFile as error:
            raise CheckpointError(f"{error}; {_RESTORE}.") from None
        weight_map = document.get("weight_map") if isinstance(document, dict) else None
        if not isinstance(weight_map, dict) or not all(
                isinstance(name, str) and isinstance(file, str) and _plain_file_name(file)
                for name, file in weight_map.items()):
            raise CheckpointError(f"{index} has no weight_map of tensor names to safetensors files of "
                                  f"{directory}; {_RESTORE}.")
        return weight_map
    if (directory / SINGLE_FILE).exists():
        try:
            with safe_open(str(directory / SINGLE_FILE), framework="pt") as handle:
                return {name: SINGLE_FILE for name in handle.keys()}
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"{directory / SINGLE_FILE} cannot be read as safetensors ({error}); "
                                  f"{_RESTORE}.") from None
    raise CheckpointError(f"{directory} has neither {INDEX_FILE} nor {SINGLE_FILE}; model.path must be "
                          "an HF checkpoint directory with safetensors weights.")


def _plain_file_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def _read_object(path: Path, limit: int) -> dict:
    """A JSON object file of a checkpoint; CheckpointError naming it otherwise."""
    try:
        document = read_json(path, limit)
    except UnreadableFile as error:
        raise CheckpointError(f"{error}; {_RESTORE}.") from None
    if not isinstance(document, dict):
        raise CheckpointError(f"{path} is not a JSON object; {_RESTORE}.")
    return document


def run_source(arch: ModelArch, directory: Path | None) -> HFSource:
    """What every save of a run reproduces (passthrough.py): the checkpoint the run loads its weights from (the
    one it resumes from, else model.path), or for random weights the text-only class with nothing carried over."""
    if directory is None:
        return text_only_source(arch)
    return source_checkpoint(directory, _read_object(directory / CONFIG_FILE, MAX_CONFIG_BYTES),
                             _weight_map(directory))


def text_only_source(arch: ModelArch) -> HFSource:
    """Saves as the text-only class (hf_text_config) with nothing carried over: a run from random weights, and
    the rollout's weight-sync export where vLLM serves the text-only class."""
    return HFSource(hf_text_config(arch))


def rollout_source(arch: ModelArch, vision_language: bool) -> HFSource:
    """What the rollout's weight sync writes: the text-only class, or for Qwen3.5 on vLLM < 0.27 the
    vision-language class (its config with the default vision config, which vLLM needs to construct the class
    but builds no tower from when images are off; the language model under model.language_model.)."""
    if not vision_language:
        return text_only_source(arch)
    return HFSource(hf_vision_language_config(arch), language_model_prefix=VL_PREFIX)


def hf_vision_language_config(arch: ModelArch) -> dict:
    """config.json of Qwen3.5's vision-language class around the text config (vision_config left to the class's
    defaults)."""
    text = hf_text_config(arch)
    moe = arch.is_moe
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5_moe" if moe else "qwen3_5",
            "text_config": {key: value for key, value in text.items() if key != "architectures"},
            "tie_word_embeddings": arch.tie_word_embeddings, "torch_dtype": "bfloat16"}


def load_hf(model, arch: ModelArch, place: ShardPlace, directory: Path) -> int:
    """Copy this rank's shards out of an HF checkpoint into the model's parameters; returns how many."""
    reader = HFReader(directory)
    loaded = 0
    with torch.no_grad():
        for name, param, rule in _parameter_rules(model, arch, place):
            rank, size = group_rank_and_size(rule, place)
            source = {hf_name: reader.get(hf_name) for hf_name in rule.hf_names}
            try:
                shard = rule.to_local(source, rank, size)
            except (RuntimeError, IndexError, ValueError):  # a tensor too small to cut, or of another shape
                shapes = ", ".join(f"{hf_name} {tuple(tensor.shape)}" for hf_name, tensor in source.items())
                raise CheckpointError(f"{directory}: {shapes} cannot make {name} of shape {tuple(param.shape)}; "
                                      "the checkpoint's architecture differs from the preset's.") from None
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
        # The text-only class here has no MTP head: a run from a checkpoint writes the source's config.json and
        # carries its MTP head over (passthrough.py); random weights have none, and the rollout serves none.
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


def save_training_state(directory: Path, optimizer, state: dict, written: Files) -> None:
    """Write this rank's optimizer state, then (rank 0) trainer_state.json with `state` and the size and
    checksum of every file of the checkpoint: `written` is what this rank wrote before (save_hf, save_tensors).
    Collective: rank 0 writes trainer_state.json only after every rank has finished its files."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    _make_directory(directory / OPTIMIZER_DIR)
    states = optimizer_state(optimizer)
    optimizer_file = _optimizer_file(rank)
    mine = {**written, optimizer_file: _write_file(directory / optimizer_file,
                                                   lambda temporary: torch.save(states, temporary))}
    everyone: list[Files] = [{} for _ in range(world_size)]
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        files = {name: record for part in everyone for name, record in part.items()}
        document = {**state, "world_size": world_size, "files": dict(sorted(files.items()))}
        _write_json(directory / STATE_FILE, {**document, STATE_CHECKSUM: _document_checksum(document)})


def mark_latest(save_dir: Path, name: str) -> None:
    """Point save_dir/latest at `name` (rank 0, after every rank has written: see save_training_state)."""
    _write_file(save_dir / LATEST, lambda temporary: temporary.write_text(name + "\n"))


def read_training_state(directory: Path, world_size: int) -> dict:
    state = _read_object(directory / STATE_FILE, MAX_STATE_BYTES)
    for key in ("iteration", "consumed_samples"):
        value = state.get(key)
        if (key == "iteration" or value is not None) and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise CheckpointError(f"{directory / STATE_FILE} has {key} {value!r}, not a count; {_RESTORE}.")
    if state.get("world_size") != world_size:
        raise CheckpointError(f"{directory} was saved by {state.get('world_size')} ranks but this run has "
                              f"{world_size}; resume with the same parallel settings.")
    return state


def load_training_state(directory: Path, optimizer, device: str = "cuda") -> None:
    path = directory / _optimizer_file(dist.get_rank())
    if not path.exists():
        raise CheckpointError(f"{path} is missing; the checkpoint was written by a different parallel layout.")
    try:
        # weights_only: unpickling can run code, and a checkpoint directory may come from elsewhere. torch's
        # weights-only loader allows tensors (and nn.Parameter), dtypes, devices, containers and numbers, which is
        # all these states hold: torch AdamW's state_dict (step/exp_avg/exp_avg_sq tensors, param groups of
        # floats, bools, tuples and None) and Megatron-Core 0.19's DistributedOptimizer (its state_dict() of
        # param groups plus an optional grad-scaler dict of a tensor and ints; get_parameter_state_dp_reshardable()
        # keyed by buffer index and (param dtype, grad dtype), holding lists of {"param", "exp_avg",
        # "exp_avg_sq": tensor, "gbuf_local_start"/"gbuf_local_end": int} and per-bucket element counts).
        # (Read from Megatron-Core's distrib_optimizer.py; Megatron needs a GPU, so the check is on a state of
        # that shape built with torch here.) torch.serialization.get_unsafe_globals_in_checkpoint finds nothing
        # outside the default allow-list in either, so no add_safe_globals is needed.
        states = torch.load(path, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as error:
        reason = (str(error).splitlines() or [type(error).__name__])[0] or type(error).__name__
        raise CheckpointError(f"{path} cannot be loaded ({reason}); point {directory.parent / LATEST} at an earlier "
                              f"checkpoint of {directory.parent}.") from None
    if not isinstance(states, list) or not all(isinstance(entry, dict) and "state_dict" in entry
                                               for entry in states):
        raise CheckpointError(f"{path} holds no optimizer states of gdnctl's; point {directory.parent / LATEST} at "
                              f"an earlier checkpoint of {directory.parent}.")
    try:
        load_optimizer_state(optimizer, states)
    except (KeyError, ValueError, TypeError, IndexError) as error:  # torch's load_state_dict on another layout
        raise CheckpointError(f"{path} does not fit this run's optimizer ({type(error).__name__}: {error}); resume "
                              "with the model and parallel settings the checkpoint was saved with.") from None


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def _optimizer_file(rank: int) -> str:
    return f"{OPTIMIZER_DIR}/rank-{rank:05d}.pt"


# --- choosing the checkpoint to resume from ---------------------------------------------------------------

@dataclass(frozen=True)
class _Expected:
    """A file a checkpoint must hold, with its recorded size and checksum; neither for a checkpoint saved before
    gdnctl recorded them (then only what the file's own format says about its length is checked)."""

    name: str
    size: int | None = None
    sha256: str | None = None


def latest_checkpoint(save_dir: Path) -> Path | None:
    """The checkpoint to resume from: the one save_dir/latest names if every file it recorded is there with its
    size and checksum, else the newest older one that is (one line on stderr says which and why); None when
    there is no `latest`. Checkpoints newer than the one `latest` names are never taken: `latest` moving is what
    completes a save.

    Collective, and every rank gets the same answer: rank 0 lists the candidates and reads each one's
    trainer_state.json; the files are then checked by all ranks, each taking every world-size-th file (so the
    checkpoint is read once, in parallel), and the findings gathered to all."""
    candidates = _from_rank_zero(partial(_candidates, save_dir))
    rejected: list[str] = []
    for directory in candidates:
        expected = _from_rank_zero(partial(_expected_files, directory))
        problem = expected if isinstance(expected, str) else _first_problem(directory, expected)
        if problem is None:
            _announce(directory, rejected, legacy=all(file.sha256 is None for file in expected))
            return directory
        rejected.append(f"checkpoint {directory.name} is {problem}")
    if rejected:
        raise CheckpointError(f"no checkpoint in {save_dir} can be resumed ({'; '.join(rejected)}); restore an "
                              f"intact checkpoint directory there and write its name into {save_dir / LATEST}, "
                              "or delete that file to start the run over.")
    return None


def _from_rank_zero(compute: Callable[[], object]):
    """compute() on rank 0, its result on every rank: the nodes of a job can see a shared file system at
    slightly different moments, and a choice all ranks must share has to come from one reading."""
    box = [compute() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _iteration(name: str) -> int | None:
    match = CHECKPOINT_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def _candidates(save_dir: Path) -> list[Path]:
    """The checkpoint `latest` names, then the older ones, newest first."""
    marker = save_dir / LATEST
    if not marker.exists():
        return []
    named = save_dir / marker.read_text(errors="replace").strip()
    newest = _iteration(named.name)
    older = {iteration: path for path in save_dir.iterdir()
             if path.is_dir() and path != named and (iteration := _iteration(path.name)) is not None
             and (newest is None or iteration < newest)}
    return [named, *(older[iteration] for iteration in sorted(older, reverse=True))]


def _expected_files(directory: Path) -> list[_Expected] | str:
    """The files `directory` must hold, from its trainer_state.json, or why it cannot be resumed."""
    if not directory.is_dir():
        return f"missing ({directory} does not exist)"
    path = directory / STATE_FILE
    if not path.is_file():
        return f"incomplete ({STATE_FILE} is missing)"
    try:
        state = json.loads(path.read_bytes())
    except ValueError:
        return f"corrupt ({STATE_FILE} is not valid JSON)"
    if not isinstance(state, dict):
        return f"corrupt ({STATE_FILE} is not a JSON object)"
    if "files" not in state and STATE_CHECKSUM not in state:
        return _legacy_expected_files(directory, state)
    if state.get(STATE_CHECKSUM) != _document_checksum(state):
        return f"corrupt ({STATE_FILE} differs from its recorded checksum)"
    return [_Expected(name, record["size"], record[CHECKSUM]) for name, record in state["files"].items()]


def _legacy_expected_files(directory: Path, state: dict) -> list[_Expected] | str:
    """A checkpoint saved before gdnctl recorded its files: the config, the weights its index names (or the one
    safetensors file) and every rank's optimizer state."""
    ranks = state.get("world_size")
    if not isinstance(ranks, int):
        return f"corrupt ({STATE_FILE} has no world_size)"
    weights = [SINGLE_FILE]
    if (directory / INDEX_FILE).is_file():
        try:
            weights = sorted(set(json.loads((directory / INDEX_FILE).read_bytes())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"corrupt ({INDEX_FILE} cannot be read)"
    return [_Expected(name) for name in (CONFIG_FILE, *weights, *(_optimizer_file(r) for r in range(ranks)))]


def _first_problem(directory: Path, expected: list[_Expected]) -> str | None:
    """The problem of the first failing file in `expected` order, the same on every rank (collective)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = next(((index, problem) for index in range(rank, len(expected), world_size)
                 if (problem := _file_problem(directory, expected[index])) is not None), None)
    everyone: list[tuple[int, str] | None] = [None] * world_size
    dist.all_gather_object(everyone, mine)
    found = [entry for entry in everyone if entry is not None]
    return min(found)[1] if found else None


def _file_problem(directory: Path, expected: _Expected) -> str | None:
    path, name = directory / expected.name, expected.name
    if not path.is_file():
        return f"incomplete ({name} is missing)"
    size = path.stat().st_size
    if expected.sha256 is None:
        return _legacy_file_problem(path, name, size)
    if size != expected.size:
        return _size_problem(name, size, expected.size)
    if _file_checksum(path) != expected.sha256:
        return f"corrupt ({name}: its {CHECKSUM} differs from the one recorded when it was saved)"
    return None


def _size_problem(name: str, size: int, expected: int) -> str:
    if size < expected:
        return f"incomplete ({name}: {size:,} of {expected:,} bytes)"
    return f"corrupt ({name}: {size:,} bytes where {expected:,} were written)"


def _legacy_file_problem(path: Path, name: str, size: int) -> str | None:
    """What a file's own format says of its completeness: a safetensors header gives the file's length, a
    torch.save archive (a zip) ends with its central directory, a JSON file must parse."""
    if name.endswith(".safetensors"):
        declared = _safetensors_length(path, size)
        if declared is None:
            return f"corrupt ({name} has no readable safetensors header)"
        return None if size == declared else _size_problem(name, size, declared)
    if name.endswith(".pt"):
        return None if zipfile.is_zipfile(path) else f"incomplete ({name} is not a whole torch.save archive)"
    try:
        json.loads(path.read_bytes())
    except ValueError:
        return f"corrupt ({name} is not valid JSON)"
    return None


def _safetensors_length(path: Path, size: int) -> int | None:
    """The length a safetensors file declares: 8 bytes of header length, the JSON header, then the data up to
    the furthest tensor's end offset; None when the header cannot be read."""
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8 or (length := struct.unpack("<Q", prefix)[0]) > size:
            return None
        try:
            header = json.loads(handle.read(length))
            ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None
    return 8 + length + max(ends, default=0)


def _announce(directory: Path, rejected: list[str], legacy: bool) -> None:
    if dist.get_rank() != 0:
        return
    if rejected:
        print(f"gdnctl: {'; '.join(rejected)}; resuming from {directory.name}", file=sys.stderr, flush=True)
    if legacy:
        print(f"gdnctl: checkpoint {directory.name} was saved before gdnctl recorded checksums, so only that its "
              "files are present and as long as their formats declare was checked", file=sys.stderr, flush=True)


# --- durable writes --------------------------------------------------------------------------------------

def _write_file(path: Path, write: Callable[[Path], object], durable: bool = True) -> dict:
    """Write `path` whole or not at all: `write(temporary)` fills a temporary file in the same directory (so the
    rename cannot cross file systems), which is fsynced and renamed over `path`, and then the directory is
    fsynced so that the rename itself survives a power loss. Returns the file's size and checksum (size only
    when not `durable`). The temporary name is fixed, so a save that a crash interrupted is cleaned up by the
    next save of the same file rather than left behind."""
    temporary = path.with_name(f".{path.name}.tmp")
    _claim_temporary(temporary)
    write(temporary)
    record = _sync_and_describe(temporary) if durable else {"size": temporary.stat().st_size}
    os.replace(temporary, path)
    if durable:
        _fsync_directory(path.parent)
    return record


def _claim_temporary(temporary: Path) -> None:
    """Create `temporary` as a new, empty file of this save. What a crashed save left there (a regular file) is
    removed first; a link there is refused, never written through: the writers below open the name and would
    truncate the file it points to. `latest` and the checkpoint's files themselves are safe from links: os.replace
    renames over a link, it does not follow it."""
    if temporary.is_symlink() or (temporary.exists() and not temporary.is_file()):
        raise CheckpointError(f"{temporary} is a symbolic link or not a regular file, which gdnctl does not write "
                              f"through (it would overwrite what it points to); remove it (rm {temporary}) and "
                              "start the job again.")
    temporary.unlink(missing_ok=True)
    try:
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    except FileExistsError:  # created between the check and the open: by another writer, so not this save's
        raise CheckpointError(f"{temporary} appeared while this save was writing it: another job writes into "
                              f"{temporary.parent}; give each job its own train.save_dir.") from None


def _sync_and_describe(path: Path) -> dict:
    with path.open("rb") as handle:
        # Hashed before the fsync: the hash reads the page cache while the kernel is already writing back.
        # Linux flushes a file's dirty pages through any descriptor of it, a read-only one too.
        digest = hashlib.file_digest(handle, CHECKSUM).hexdigest()
        os.fsync(handle.fileno())
        return {"size": os.fstat(handle.fileno()).st_size, CHECKSUM: digest}


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _make_directory(directory: Path) -> None:
    """mkdir -p, each new directory's entry fsynced in its parent (a checkpoint whose directory entry is lost
    in a crash would take its files with it)."""
    created = [path for path in (directory, *directory.parents) if not path.exists()]
    directory.mkdir(parents=True, exist_ok=True)
    for path in created:
        _fsync_directory(path.parent)


def _write_json(path: Path, document: dict, durable: bool = True) -> dict:
    text = json.dumps(document, indent=2) + "\n"
    return _write_file(path, lambda temporary: temporary.write_text(text), durable)


def _write_safetensors(path: Path, tensors: dict[str, torch.Tensor], durable: bool) -> dict:
    from safetensors.torch import save_file

    return _write_file(path, lambda temporary: save_file(tensors, str(temporary), metadata={"format": "pt"}),
                       durable)


def _document_checksum(document: dict) -> str:
    """sha256 of a JSON document's keys other than its own checksum, serialized canonically."""
    content = {key: value for key, value in document.items() if key != STATE_CHECKSUM}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _file_checksum(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, CHECKSUM).hexdigest()
