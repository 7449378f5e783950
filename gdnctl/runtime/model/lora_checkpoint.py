"""What a checkpoint of a LoRA run holds, and how a resume reads it back.

LoRA trains adapters on a frozen base, so its checkpoints do not repeat the base (the base is model.path's,
unchanged by training, and a 35B model's is 70 GB against the adapters' megabytes). A checkpoint holds:

    adapter/adapter_config.json          the adapters in the Hugging Face `peft` layout (lora_adapters.py):
    adapter/adapter_model.safetensors      peft.PeftModel.from_pretrained(base_model, "save_dir/iter_N/adapter")
    adapter/rank-RANK.safetensors        this rank's adapter parameters under their Megatron names: what a resume
                                         loads
    optimizer/rank-RANK.pt               as in every checkpoint: the adapters' fp32 main params and Adam moments
    trainer_state.json                   as in every checkpoint, plus `lora`: the adapters' rank, alpha, dropout and
                                         targets, the base's path and each rank's fingerprint of its base tensors

and at the run's last step also the merged model, base + (alpha / rank) B A, as the HF checkpoint every gdnctl
checkpoint is (config.json, the safetensors and their index, the source's carried-over tensors; checkpoint.py),
written by the builder's export, which merges the adapters (megatron-bridge 0.6.2
models/conversion/auto_bridge.py export_hf_weights, merge_adapter_weights=True by default): the last checkpoint is
then what vLLM serves and what a later job names as model.path.

Why a resume reads the per-rank Megatron-named tensors rather than the `peft` files: they are the very tensors the
model held, on the very layout (tensor, expert and pipeline ranks) the optimizer state beside them was saved from,
so the restore is exact with nothing to convert back; the `peft` files come out of megatron-bridge's HF conversion
(fused QKV and gate/up split, TP and EP gathered: models/conversion/peft_bridge.py
stream_adapter_weights_megatron_to_hf, lines 843-1019), which gdnctl would otherwise have to invert.

Why the fingerprint: a resume loads the base again from model.path. Were model.path replaced since (another
revision of the model), adapters trained on one base would go on training on another without a word. The
fingerprint is exact integer arithmetic on the bits of every frozen tensor (sums that wrap modulo 2^64, whatever
order a GPU adds them in), so the same base gives the same fingerprint on any GPU.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch

from gdnctl.runtime.model.checkpoint_layout import CheckpointError, Files
from gdnctl.runtime.model.durable_files import make_directory, write_safetensors
from gdnctl.runtime.model.lora_adapters import CONFIG_FILE, WEIGHTS_FILE, Adapter, write_adapter
from gdnctl.schema import EngineLora

ADAPTER_DIR = "adapter"
STATE_KEY = "lora"  # trainer_state.json's record of the adapters
# megatron-bridge's HF names of an adapter's two matrices (models/conversion/peft_bridge.py
# MEGATRON_TO_HF_LORA_SUFFIX, lines 91-94): `<HF weight without .weight>.lora_A.weight` and `.lora_B.weight`. A
# grouped-GEMM routed expert's adapter is exported in the layout of the bridge's expert mapping
# (stream_adapter_weights_megatron_to_hf, lines 843-1019): per expert (`mlp.experts.N.gate_proj` / `up_proj` /
# `down_proj`, 2-D) when the mapping is per-expert, stacked per expert under the 3-D parameter's own name
# (`mlp.experts.gate_up_proj`, _make_lora_param_name lines 239-250) when it is fused. Which one is
# models/conversion/utils.py moe_experts_stored_packed (lines 320-355): the checkpoint's keys decide, and without
# them (gdnctl's bridge is built from a config, runtime/model/bridge.py) the default is per-expert.
LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"
# Elements hashed per piece of a large tensor (the int64 copy of a piece is 8 bytes an element).
FINGERPRINT_PIECE = 1 << 26


def shard_file(rank: int) -> str:
    return f"{ADAPTER_DIR}/rank-{rank:05d}.safetensors"


def writes_merged(iteration: int, train_iters: int) -> bool:
    """Whether the save at `iteration` also writes the merged full weights: only the run's last one (the others
    hold the adapters alone; see the module docstring)."""
    return iteration >= train_iters


# --- the peft layout ------------------------------------------------------------------------------------------


def adapters_from_hf(
    pairs: Iterable[tuple[str, torch.Tensor]], rename: Callable[[str], str] = lambda name: name
) -> dict[str, Adapter]:
    """megatron-bridge's exported adapter tensors (`X.lora_A.weight`, `X.lora_B.weight`) as lora_adapters.Adapter
    by the HF weight they adapt: `X.weight` for a module's 2-D weight, `X` itself for a routed experts' 3-D
    parameter (A and B then one per expert, experts first), per-expert routed adapters fused into those
    (fused_routed_experts). `rename` maps a text-model name to the name the base checkpoint stores it under (a
    vision-language class keeps the language model under its own prefix)."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in pairs:
        for suffix, half in ((LORA_A, "a"), (LORA_B, "b")):
            if name.endswith(suffix):
                halves.setdefault(name.removesuffix(suffix), {})[half] = tensor
                break
        else:
            raise ValueError(
                f"megatron-bridge exported {name}, which is neither a lora_A nor a lora_B weight; use the "
                "megatron-bridge version the preset's runtime.megatron_bridge names."
            )
    adapters = {}
    for base, pair in halves.items():
        if set(pair) != {"a", "b"}:
            raise ValueError(
                f"megatron-bridge exported only lora_{'A' if 'a' in pair else 'B'} of {base}; use the "
                "megatron-bridge version the preset's runtime.megatron_bridge names."
            )
        weight = base if pair["a"].dim() == 3 else f"{base}.weight"
        adapters[weight] = Adapter(pair["a"], pair["b"])
    return {rename(name): adapter for name, adapter in fused_routed_experts(adapters).items()}


# A routed expert's projection as a per-expert export names it (text-model names).
_ROUTED_EXPERT = re.compile(
    r"(?P<experts>.+\.mlp\.experts)\.(?P<index>\d+)\."
    r"(?P<projection>gate_proj|up_proj|down_proj)\.weight"
)


def fused_routed_experts(adapters: Mapping[str, Adapter]) -> dict[str, Adapter]:
    """Per-expert adapters of the routed experts (`X.mlp.experts.N.gate_proj.weight`, `up_proj`, `down_proj`) as
    adapters of the two 3-D parameters transformers 5's Qwen3.5-MoE class holds, which `peft` targets:
    `X.mlp.experts.gate_up_proj` (experts x 2I x H: every expert's gate rows, then its up rows, as transformers
    fuses a per-expert checkpoint) and `X.mlp.experts.down_proj`, A and B stacked over experts 0..E-1. The other
    adapters are returned as they are.

    Exact: Megatron's linear_fc1 adapter is one lora_A for the fused gate and up weight and one lora_B whose rows
    are gate's then up's, and megatron-bridge exports it as gate_proj and up_proj with that same A and the two
    halves of B (peft_bridge.py _get_fused_adapter_linear_out_slices, _split_fused_fc1_linear_out_weight), so
    stacking A once and concatenating B's halves gives back exactly the adapter of the fused weight."""
    kept: dict[str, Adapter] = {}
    experts: dict[str, dict[int, dict[str, Adapter]]] = defaultdict(lambda: defaultdict(dict))
    for name, adapter in adapters.items():
        match = _ROUTED_EXPERT.fullmatch(name)
        if match is None or adapter.a.dim() != 2:
            kept[name] = adapter
        else:
            experts[match["experts"]][int(match["index"])][match["projection"]] = adapter
    for prefix, by_expert in experts.items():
        indices = sorted(by_expert)
        projections = {frozenset(found) for found in by_expert.values()}
        if indices != list(range(len(indices))) or len(projections) != 1:
            raise ValueError(
                f"megatron-bridge exported adapters of {prefix} for experts {indices} with projections "
                f"{sorted(sorted(found) for found in projections)}, not the same projections of every "
                "expert 0..E-1; use the megatron-bridge version the preset's runtime.megatron_bridge "
                "names."
            )
        found = next(iter(projections))
        if found & {"gate_proj", "up_proj"}:
            if not {"gate_proj", "up_proj"} <= found:
                raise ValueError(
                    f"megatron-bridge exported {prefix}'s {' '.join(sorted(found))} adapters, which "
                    "cannot be fused into gate_up_proj without both gate_proj and up_proj; use the "
                    "megatron-bridge version the preset's runtime.megatron_bridge names."
                )
            for index in indices:
                if not torch.equal(by_expert[index]["gate_proj"].a, by_expert[index]["up_proj"].a):
                    raise ValueError(
                        f"megatron-bridge exported different lora_A for {prefix}.{index}.gate_proj and "
                        "up_proj, which one fused adapter cannot hold; use the megatron-bridge version "
                        "the preset's runtime.megatron_bridge names."
                    )
            kept[f"{prefix}.gate_up_proj"] = Adapter(
                torch.stack([by_expert[index]["gate_proj"].a for index in indices]),
                torch.stack(
                    [torch.cat([by_expert[index]["gate_proj"].b, by_expert[index]["up_proj"].b]) for index in indices]
                ),
            )
        if "down_proj" in found:
            kept[f"{prefix}.down_proj"] = Adapter(
                torch.stack([by_expert[index]["down_proj"].a for index in indices]),
                torch.stack([by_expert[index]["down_proj"].b for index in indices]),
            )
    return kept


# --- trainer_state.json's record ------------------------------------------------------------------------------


def expert_adapters(spec: EngineLora) -> str:
    """train.lora.expert_adapters as the engine config carries it."""
    return "shared" if spec.share_expert_adapters else "per_expert"


def state_record(spec: EngineLora, base: str, fingerprints: list[str]) -> dict:
    """trainer_state.json's `lora`: what the adapters are and which base they were trained on (per rank)."""
    return {
        "rank": spec.rank,
        "alpha": spec.alpha,
        "dropout": spec.dropout,
        "targets": list(spec.targets),
        "expert_adapters": expert_adapters(spec),
        "base": base,
        "base_fingerprints": list(fingerprints),
    }


def resume_problem(state: dict, spec: EngineLora | None, directory: Path) -> str | None:
    """Why the checkpoint `state` (its trainer_state.json) cannot be resumed by this run's train.lora, or None.
    A LoRA checkpoint holds no base and a full one no adapters, so neither resumes the other; adapters of another
    rank or targets would not fit the model built."""
    record = state.get(STATE_KEY)
    restart = "set train.save_dir to a new directory"
    if spec is None and record is None:
        return None
    if spec is None:
        return (
            f"{directory} holds LoRA adapters (train.lora) without full weights to resume every parameter from; "
            f"set train.lora as that run had it to go on training the adapters, or {restart}."
        )
    if record is None:
        return (
            f"{directory} is a full-parameter checkpoint, and train.lora trains adapters on a frozen base; "
            f"{restart}, and model.path to {directory} to train adapters on its weights."
        )
    saved = (record.get("rank"), record.get("alpha"), sorted(record.get("targets") or []))
    wanted = (spec.rank, spec.alpha, sorted(spec.targets))
    if saved != wanted:
        return (
            f"{directory} holds adapters of rank {saved[0]}, alpha {saved[1]} on {', '.join(saved[2])}, but "
            f"train.lora asks for rank {wanted[0]}, alpha {wanted[1]} on {', '.join(wanted[2])}; set train.lora "
            f"as the checkpoint's, or {restart}."
        )
    # Checkpoints written before the setting existed hold per-expert adapters, the only kind there was.
    saved_experts, wanted_experts = record.get("expert_adapters", "per_expert"), expert_adapters(spec)
    if "experts" in wanted[2] and saved_experts != wanted_experts:
        return (
            f"{directory} holds {saved_experts} adapters on the routed experts, but this run asks for "
            f"{wanted_experts} ones (train.lora.expert_adapters, as `gdnctl explain` shows it decided); set "
            f"train.lora.expert_adapters: {saved_experts} as the checkpoint's, or {restart}."
        )
    return None


def base_problem(record: dict, fingerprints: list[str], base: str) -> str | None:
    """Why the base loaded now is not the one the checkpoint's adapters were trained on, or None."""
    if record.get("base_fingerprints") == fingerprints:
        return None
    then = record.get("base")
    moved = f" (the checkpoint's base was {then})" if then != base else ""
    return (
        f"the base weights loaded from model.path {base} differ from those the checkpoint's adapters were trained "
        f"on{moved}; point model.path at the base the adapters were trained on, or set train.save_dir to a new "
        "directory to train new adapters."
    )


# --- the base's fingerprint -----------------------------------------------------------------------------------


def _integer_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as signed integers of its own width (bf16 -> int16, fp32 -> int32), flattened."""
    widths = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return tensor.detach().contiguous().reshape(-1).view(widths[tensor.element_size()])


def base_fingerprint(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over each tensor's name, shape, dtype and two exact sums of its bits (plain, and each element times
    its position), in int64 that wraps: integer addition is associative, so any reduction order gives the same
    sums; the positional sum tells a permutation of the same values apart."""
    digest = hashlib.sha256()
    for name, tensor in named:
        bits = _integer_view(tensor)
        plain = torch.zeros((), dtype=torch.int64, device=bits.device)
        positional = torch.zeros((), dtype=torch.int64, device=bits.device)
        for start in range(0, bits.numel(), FINGERPRINT_PIECE):
            piece = bits[start : start + FINGERPRINT_PIECE].to(torch.int64)
            positions = torch.arange(start + 1, start + 1 + piece.numel(), dtype=torch.int64, device=bits.device)
            plain += piece.sum()
            positional += (piece * positions).sum()
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|{int(plain)}|{int(positional)}\n".encode())
    return digest.hexdigest()


# --- the per-rank adapter tensors -----------------------------------------------------------------------------


def adapter_tensors(model) -> dict[str, torch.Tensor]:
    """This rank's trainable parameters (the adapters) by their names in the bare model."""
    module = getattr(model, "module", model)  # under Megatron's DDP wrapper
    return {name: param for name, param in module.named_parameters() if param.requires_grad}


def shard_problems(
    model_shapes: Mapping[str, tuple[int, ...]], stored_shapes: Mapping[str, tuple[int, ...]]
) -> list[str]:
    """How a rank's stored adapter tensors differ from the model's adapters (empty when they match)."""
    problems = [f"{name} is not in the checkpoint" for name in sorted(set(model_shapes) - set(stored_shapes))]
    problems += [
        f"the checkpoint has {name}, which this model lacks" for name in sorted(set(stored_shapes) - set(model_shapes))
    ]
    problems += [
        f"{name} is {tuple(stored_shapes[name])} in the checkpoint and {tuple(model_shapes[name])} here"
        for name in sorted(set(model_shapes) & set(stored_shapes))
        if tuple(stored_shapes[name]) != tuple(model_shapes[name])
    ]
    return problems


def write_shard(model, directory: Path, rank: int, durable: bool = True) -> Files:
    """Write this rank's adapter tensors (Megatron names, its own shards) to adapter/rank-RANK.safetensors."""
    make_directory(directory / ADAPTER_DIR)
    tensors = {name: param.detach().to("cpu", copy=True).contiguous() for name, param in adapter_tensors(model).items()}
    file_name = shard_file(rank)
    return {file_name: write_safetensors(directory / file_name, tensors, durable)}


def load_shard(model, directory: Path, rank: int) -> int:
    """Copy adapter/rank-RANK.safetensors into this rank's adapters, exactly; returns how many tensors."""
    from safetensors import SafetensorError, safe_open

    path = directory / shard_file(rank)
    params = adapter_tensors(model)
    try:
        with safe_open(str(path), framework="pt") as handle:
            stored = {name: handle.get_tensor(name) for name in handle.keys()}
    except (SafetensorError, OSError) as error:
        raise CheckpointError(
            f"{path} cannot be read ({error}); restore the checkpoint's files, or point "
            f"{directory.parent / 'latest'} at an earlier checkpoint."
        ) from None
    problems = shard_problems(
        {name: tuple(param.shape) for name, param in params.items()},
        {name: tuple(tensor.shape) for name, tensor in stored.items()},
    )
    if problems:
        raise CheckpointError(
            f"{path} does not fit this run's adapters: {'; '.join(problems[:3])}; resume with the "
            "train.lora and parallel settings the checkpoint was saved with."
        )
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(stored[name].to(param.dtype))
    return len(params)


def write_peft(
    directory: Path, adapters: Mapping[str, Adapter], spec: EngineLora, base: str, durable: bool = True
) -> Files:
    """adapter/adapter_config.json and adapter_model.safetensors (one rank writes them); returns their records
    under their paths in the checkpoint."""
    written = write_adapter(
        directory / ADAPTER_DIR, adapters, alpha=spec.alpha, dropout=spec.dropout, base_model=base, durable=durable
    )
    assert set(written) == {CONFIG_FILE, WEIGHTS_FILE}
    return {f"{ADAPTER_DIR}/{name}": record for name, record in written.items()}
