"""The smoke's checkpoint round trip: the model and optimizer state in memory against what the checkpoint saved at
the last smoke step loads back as, through the same calls a resumed job makes.

Two ways to load it back. On CPU a second policy is built from the smoke's engine config, and resumes from the
checkpoint exactly as a restarted job would (the models there are small). On GPUs a second model would not fit
beside the first, so the trainer's own model and optimizer are zeroed (`scramble`) and the checkpoint loaded into
them with the calls of a resume (`reload_in_place`).

Compared as per-tensor checksums (the sum and the sum of squares in float64, and the element count) taken before
and after, so nothing is held twice: a tensor the save left out, the load did not reach, or that came back
truncated, in another dtype or from another rank's file changes its checksum. Optimizer state is what the
checkpoint writer saves (`checkpoint.optimizer_state`: torch AdamW's state dict, or Megatron's fp32 main params and
moments), numbers in it (lr, betas, step counts) included.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.runtime.model import checkpoint

Checksums = dict[str, tuple[float, float, int]]
WEIGHTS = "weights"
OPTIMIZER = "optimizer"
# Checksums of the same values in the same order agree exactly; the tolerance only forgives a different
# reduction order, by far less than any changed element moves a sum of squares.
RELATIVE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class RoundTrip:
    checkpoint: str  # the checkpoint directory's name
    weights: int  # weight tensors compared (this rank)
    optimizer: int  # optimizer tensors and numbers compared (this rank)
    step: int  # the step the checkpoint records
    problems: tuple[str, ...]


def _leaves(value: object, path: str) -> Iterator[tuple[str, object]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{path}[{index}]")
    elif isinstance(value, (torch.Tensor, int, float)):
        yield path, value


def _checksum(value: torch.Tensor | int | float) -> tuple[float, float, int]:
    if isinstance(value, torch.Tensor):
        values = value.detach().to(torch.float64)
        return values.sum().item(), values.square().sum().item(), values.numel()
    return float(value), float(value) ** 2, 1


def state_checksums(model: torch.nn.Module, optimizer) -> Checksums:
    sums = {f"{WEIGHTS}/{name}": _checksum(param) for name, param in model.named_parameters()}
    for path, value in _leaves(checkpoint.optimizer_state(optimizer), OPTIMIZER):
        sums[path] = _checksum(value)
    return sums


def count(sums: Checksums, kind: str) -> int:
    return sum(name.startswith((f"{kind}/", f"{kind}[")) for name in sums)


def differences(before: Checksums, after: Checksums) -> list[str]:
    problems = [f"{name} is missing after the load" for name in sorted(set(before) - set(after))]
    problems += [f"{name} appeared only after the load" for name in sorted(set(after) - set(before))]
    for name in sorted(set(before) & set(after)):
        if not all(_close(a, b) for a, b in zip(before[name], after[name], strict=True)):
            problems.append(
                f"{name} differs (sum of squares {before[name][1]:.6g} in memory, {after[name][1]:.6g} loaded)"
            )
    return problems


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= RELATIVE_TOLERANCE * max(abs(a), abs(b), 1e-30)


@torch.no_grad()
def scramble(model: torch.nn.Module, optimizer) -> None:
    """Zero the model's weights and every optimizer's parameters (Megatron: the fp32 main params) and state, so that
    whatever a load leaves untouched shows up as a difference instead of passing for loaded."""
    for param in model.parameters():
        param.zero_()
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(sub, "optimizer", sub)  # Megatron's wrappers hold the torch optimizer that owns the state
        for group in inner.param_groups:
            for param in group["params"]:
                param.zero_()
        for state in inner.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()


def compare(directory: Path, before: Checksums, after: Checksums, step: int, expected_step: int) -> RoundTrip:
    """This rank's round trip: `before` is the state in memory, `after` what the checkpoint loaded back as."""
    problems = differences(before, after)
    if step != expected_step:
        problems.insert(0, f"the checkpoint resumes at step {step}, not at step {expected_step}")
    return RoundTrip(directory.name, count(before, WEIGHTS), count(before, OPTIMIZER), step, tuple(problems))


def reload_in_place(trainer, directory: Path) -> RoundTrip:
    """The Megatron trainer's state against `directory` loaded back into the same model and optimizer."""
    before = state_checksums(trainer.model, trainer.optimizer)
    scramble(trainer.model, trainer.optimizer)
    trainer.reload(directory)
    after = state_checksums(trainer.model, trainer.optimizer)
    step = checkpoint.read_training_state(directory, dist.get_world_size())["iteration"]
    return compare(directory, before, after, step, trainer.iteration)


def gathered(mine: RoundTrip) -> RoundTrip:
    """Every rank's round trip as one (collective): tensors counted over ranks, each problem with its rank."""
    everyone: list[RoundTrip | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    problems = tuple(
        f"rank {rank}: {problem}" if len(everyone) > 1 else problem
        for rank, result in enumerate(everyone)
        for problem in result.problems
    )
    return RoundTrip(
        mine.checkpoint, sum(r.weights for r in everyone), sum(r.optimizer for r in everyone), mine.step, problems
    )
