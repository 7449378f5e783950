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
    preprocessor_config.json          (the CPU image sft's) the image processor the run cut its images with
    optimizer/rank-RANK.pt            each rank's optimizer state (fp32 main params and Adam moments)
    trainer_state.json                iteration, consumed samples, and the size and sha256 of every file above

Every file is written to a temporary name, fsynced, renamed into place and its directory fsynced, so a file
under its real name is whole and on disk. trainer_state.json is written last, by rank 0 once every rank has
written its files, and `save_dir/latest` moves to the checkpoint only after that: a job killed (or a machine
losing power) at any moment of a save leaves `latest` naming the previous, complete checkpoint.

A resume checks the checkpoint `latest` names against its recorded sizes and checksums (the ranks share the
reading); one that fails (a disk error, a file truncated or edited since) gives way to the newest older
checkpoint that passes, with one line on stderr saying which and why.

The file is split along those concerns: checkpoint_layout.py (file names, bounds, the error), durable_files.py
(the durable writes and checksums), training_state.py (optimizer state, trainer_state.json, latest) and
resume_choice.py (which checkpoint a resume takes). This module writes and reads the HF weights and names the
whole API for its callers (`checkpoint.save_hf`, `checkpoint.latest_checkpoint`, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.files import UnreadableFile, read_json
from gdnctl.knowledge import VISION_CONFIG_KEYS, VISION_TOKEN_KEYS, ModelArch
from gdnctl.runtime.model.checkpoint_layout import (  # noqa: F401 (re-exported: callers use checkpoint.NAME)
    CHECKPOINT_NAME,
    CHECKSUM,
    CONFIG_FILE,
    INDEX_FILE,
    LATEST,
    MAX_CONFIG_BYTES,
    MAX_INDEX_BYTES,
    MAX_STATE_BYTES,
    OPTIMIZER_DIR,
    RESTORE,
    SINGLE_FILE,
    STATE_CHECKSUM,
    STATE_FILE,
    CheckpointError,
    Files,
    check_source_outside_save_dir,
    checkpoint_name,
    optimizer_file,
    read_object,
    refuse_overwriting_source,
)
from gdnctl.runtime.model.durable_files import make_directory, write_file, write_json, write_safetensors
from gdnctl.runtime.model.hf_weights import (
    VISION_PREFIX,
    VL_PREFIX,
    Rule,
    ShardPlace,
    UnknownParameter,
    canonical_hf_name,
    group_rank_and_size,
    rules_for,
)
from gdnctl.runtime.model.lora_adapters import CONFIG_FILE as ADAPTER_CONFIG
from gdnctl.runtime.model.lora_checkpoint import ADAPTER_DIR
from gdnctl.runtime.model.passthrough import PASSTHROUGH_FILE, HFSource, source_checkpoint, write_passthrough
from gdnctl.runtime.model.resume_choice import latest_checkpoint  # noqa: F401 (re-exported)
from gdnctl.runtime.model.training_state import (  # noqa: F401 (re-exported)
    load_optimizer_state,
    load_training_state,
    mark_latest,
    optimizer_state,
    read_training_state,
    save_training_state,
)


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
        raise CheckpointError(
            f"the model has a parameter gdnctl cannot map to HF names ({error.args[0]}); "
            "this model variant is not supported by the HF checkpoint writer."
        ) from None
    return [(name, param, rules[name]) for name, param in named]


def _gather(tensor: torch.Tensor, rule: Rule, groups: Groups, place: ShardPlace) -> list[torch.Tensor]:
    _, size = group_rank_and_size(rule, place)
    if size == 1:
        return [tensor]
    group = groups.tp if rule.group == "tp" else groups.etp
    shards = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(shards, tensor.contiguous(), group=group)
    return shards


def save_hf(
    model,
    arch: ModelArch,
    place: ShardPlace,
    groups: Groups,
    directory: Path,
    source: HFSource,
    *,
    durable: bool = True,
) -> Files:
    """Write this rank's part of an HF checkpoint into `directory` (collective: every rank calls it), shaped
    like `source` (passthrough.py); returns the files this rank wrote, for save_training_state.

    durable=False (the rl job's per-step export, which the rollout reloads at once and the next step replaces)
    keeps the atomic renames but skips the fsyncs and checksums: a crash there loses nothing a resume needs."""
    rank = dist.get_rank()
    make_directory(directory)
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
        written[file_name] = write_safetensors(directory / file_name, tensors, durable)
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
    make_directory(directory)
    prepared = {source.stored_name(name): tensor.detach().to("cpu").contiguous() for name, tensor in tensors}
    if not source.passthrough(prepared):
        return {
            SINGLE_FILE: write_safetensors(directory / SINGLE_FILE, prepared, durable=True),
            CONFIG_FILE: write_json(directory / CONFIG_FILE, source.config, durable=True),
        }
    # transformers reads model.safetensors alone whenever a directory has one, ignoring the index, so beside the
    # carried-over tensors the weights take a shard's name.
    file_name = _shard_file(0)
    written = {file_name: write_safetensors(directory / file_name, prepared, durable=True)}
    return {
        **written,
        **_write_passthrough_index_and_config(directory, source, dict.fromkeys(prepared, file_name), durable=True),
    }


def _shard_file(index: int) -> str:
    return f"model-{index:05d}.safetensors"


def _write_passthrough_index_and_config(
    directory: Path, source: HFSource, weight_map: dict[str, str], durable: bool
) -> Files:
    """The last files of a save, written by one rank once the weights are: the source's tensors that the save
    did not write (PASSTHROUGH_FILE), the index naming every tensor's file, and the source's config.json."""
    written: Files = {}
    carried = source.passthrough(weight_map)
    if carried:
        written[PASSTHROUGH_FILE] = write_file(
            directory / PASSTHROUGH_FILE, partial(write_passthrough, carried), durable
        )
        weight_map = {**weight_map, **dict.fromkeys(carried, PASSTHROUGH_FILE)}
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    written[INDEX_FILE] = write_json(directory / INDEX_FILE, index, durable)
    written[CONFIG_FILE] = write_json(directory / CONFIG_FILE, source.config, durable)
    return written


class ShardWriter:
    """An HF checkpoint written from a stream of whole HF-named tensors (the megatron-bridge export, which hands
    every rank every tensor): one rank adds them, a shard file is written each time `shard_bytes` fill up, and
    `close` writes what the save carries over from `source` (passthrough.py), the index and config.json and
    returns the files written, for save_training_state."""

    def __init__(self, directory: Path, source: HFSource, *, durable: bool, shard_bytes: int) -> None:
        make_directory(directory)
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
        self.written[file_name] = write_safetensors(self.directory / file_name, self.pending, self.durable)
        self.weight_map.update((name, file_name) for name in self.pending)
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> Files:
        self._flush()
        self.written.update(
            _write_passthrough_index_and_config(self.directory, self.source, self.weight_map, self.durable)
        )
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
            raise CheckpointError(
                f"{self.directory} has no tensor {name}; is it a Qwen3.5 checkpoint of the "
                "architecture the preset names?"
            )
        file, stored = self.locations[name]
        try:
            if file not in self._handles:
                self._handles[file] = safe_open(str(self.directory / file), framework="pt")
            return self._handles[file].get_tensor(stored)
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"{self.directory / file} cannot give tensor {stored} ({error}); {RESTORE}") from None


# The fix for a checkpoint directory whose files do not read back.
def _weight_map(directory: Path) -> dict[str, str]:
    """Every tensor of an HF checkpoint directory by its stored name -> the safetensors file holding it, a file
    of the directory itself (a name with a path in it would read from elsewhere)."""
    from safetensors import SafetensorError, safe_open

    index = directory / INDEX_FILE
    if index.exists():
        try:
            document = read_json(index, MAX_INDEX_BYTES)
        except UnreadableFile as error:
            raise CheckpointError(f"{error}; {RESTORE}.") from None
        weight_map = document.get("weight_map") if isinstance(document, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(name, str) and isinstance(file, str) and _plain_file_name(file)
            for name, file in weight_map.items()
        ):
            raise CheckpointError(
                f"{index} has no weight_map of tensor names to safetensors files of {directory}; {RESTORE}."
            )
        return weight_map
    if (directory / SINGLE_FILE).exists():
        try:
            with safe_open(str(directory / SINGLE_FILE), framework="pt") as handle:
                return {name: SINGLE_FILE for name in handle.keys()}
        except (SafetensorError, OSError) as error:
            raise CheckpointError(
                f"{directory / SINGLE_FILE} cannot be read as safetensors ({error}); {RESTORE}."
            ) from None
    if (directory / ADAPTER_DIR / ADAPTER_CONFIG).is_file():
        raise CheckpointError(
            f"{directory} holds LoRA adapters without the model (a LoRA run writes the merged model "
            "only at its last step); point model.path at the base the adapters were trained on, "
            "or at the LoRA run's last checkpoint for the merged model."
        )
    raise CheckpointError(
        f"{directory} has neither {INDEX_FILE} nor {SINGLE_FILE}; model.path must be "
        "an HF checkpoint directory with safetensors weights."
    )


def _plain_file_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def run_source(arch: ModelArch, directory: Path | None) -> HFSource:
    """What every save of a run reproduces (passthrough.py): the checkpoint the run loads its weights from (the
    one it resumes from, else model.path), or for random weights the text-only class with nothing carried over."""
    if directory is None:
        return text_only_source(arch)
    return source_checkpoint(directory, read_object(directory / CONFIG_FILE, MAX_CONFIG_BYTES), _weight_map(directory))


def text_only_source(arch: ModelArch) -> HFSource:
    """Saves as the text-only class (hf_text_config) with nothing carried over: a run from random weights, and
    the rollout's weight-sync export where vLLM serves the text-only class."""
    return HFSource(hf_text_config(arch))


def rollout_source(arch: ModelArch, vision_language: bool, *, images: bool = False) -> HFSource:
    """What the rollout's weight sync writes: the text-only class, or for Qwen3.5 on vLLM < 0.27 the
    vision-language class (its config with the default vision config, which vLLM needs to construct the class
    but builds no tower from when images are off; the language model under model.language_model.). With `images`
    (an rl job on image prompts) the vision-language class with its tower, which the sync sends too."""
    if images:
        return vision_language_source(arch)
    if not vision_language:
        return text_only_source(arch)
    return HFSource(hf_vision_language_config(arch), language_model_prefix=VL_PREFIX)


def hf_vision_language_config(arch: ModelArch, *, with_tower: bool = False) -> dict:
    """config.json of Qwen3.5's vision-language class around the text config: with_tower, the architecture's own
    vision tower and image token ids (a run from random weights that trains on images); otherwise vision_config is
    left to the class's defaults (the rollout's serving class, which builds no tower when images are off)."""
    text = hf_text_config(arch)
    family = arch.family
    if family.vision_language_class is None:
        raise ValueError(f"{family.label} has no vision-language class")
    config = {
        "architectures": [family.vision_language_class],
        "model_type": family.name,
        "text_config": {key: value for key, value in text.items() if key != "architectures"},
        "tie_word_embeddings": arch.tie_word_embeddings,
        "torch_dtype": "bfloat16",
    }
    if with_tower:
        if arch.vision is None:
            raise ValueError(f"{arch.label} has no vision tower")
        tower = arch.vision.model_dump(include=set(VISION_CONFIG_KEYS))
        config["vision_config"] = {**tower, "model_type": f"{family.name}_vision"}
        config.update(arch.vision.model_dump(include=set(VISION_TOKEN_KEYS)))
    return config


def vision_language_source(arch: ModelArch) -> HFSource:
    """What the saves of an image run from random weights reproduce: the vision-language class with its tower
    (nothing carried over; the tower is written with the language model)."""
    return HFSource(hf_vision_language_config(arch, with_tower=True), language_model_prefix=VL_PREFIX)


def read_vision_tower(directory: Path) -> dict[str, torch.Tensor]:
    """The vision tower's tensors of an HF checkpoint by their stored names (`model.visual.*`); empty when it has
    none."""
    from safetensors import SafetensorError, safe_open

    tensors = {}
    by_file: dict[str, list[str]] = {}
    for name, file in _weight_map(directory).items():
        if name.startswith(VISION_PREFIX):
            by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        try:
            with safe_open(str(directory / file), framework="pt") as handle:
                tensors.update({name: handle.get_tensor(name) for name in names})
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"{directory / file} cannot give the vision tower ({error}); {RESTORE}") from None
    return tensors


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
                raise CheckpointError(
                    f"{directory}: {shapes} cannot make {name} of shape {tuple(param.shape)}; "
                    "the checkpoint's architecture differs from the preset's."
                ) from None
            if shard.shape != param.shape:
                raise CheckpointError(
                    f"{directory}: {', '.join(rule.hf_names)} gives {name} the shape "
                    f"{tuple(shard.shape)}, but the model has {tuple(param.shape)}; the "
                    "checkpoint's architecture differs from the preset's."
                )
            param.copy_(shard.to(param.dtype))
            loaded += 1
    return loaded


def hf_text_config(arch: ModelArch) -> dict:
    """config.json of the text-only HF class matching the architecture (what vLLM >= 0.27 serves for Qwen3.5;
    Qwen3-Next has only the one class, Qwen3NextForCausalLM, which shares Qwen3.5's config keys)."""
    from gdnctl.knowledge import HF_CONFIG_KEYS, ROPE_KEYS

    # The keys the catalog reads from a config.json, written back from the architecture (dense models have no
    # expert fields, MoE models no dense intermediate size: those are None and left out).
    config = {
        key: getattr(arch, field)
        for key, field in HF_CONFIG_KEYS.items()
        if key not in ROPE_KEYS and getattr(arch, field) is not None
    }
    config.update(
        {
            "architectures": [arch.family.text_class],
            "model_type": arch.family.text_model_type,
            "hidden_act": "silu",
            "tie_word_embeddings": arch.tie_word_embeddings,
            "attention_bias": False,
            "layer_types": [
                "linear_attention" if arch.layer_is_gdn(i) else "full_attention" for i in range(arch.num_layers)
            ],
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": arch.rope_theta,
                "partial_rotary_factor": arch.partial_rotary_factor,
            },
            # The text-only class here has no MTP head: a run from a checkpoint writes the source's config.json and
            # carries its MTP head over (passthrough.py); random weights have none, and the rollout serves none.
            "mtp_num_hidden_layers": 0,
            "torch_dtype": "bfloat16",
        }
    )
    if arch.is_moe:
        config.update(
            shared_expert_intermediate_size=arch.shared_expert_ffn_hidden_size or 0,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return config
