"""What a resume needs beside the weights: each rank's optimizer state, trainer_state.json (the iteration, the
consumed samples, and the size and checksum of every file of the checkpoint) and save_dir/latest."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.runtime.model.checkpoint_layout import (
    LATEST,
    MAX_STATE_BYTES,
    OPTIMIZER_DIR,
    RESTORE,
    STATE_CHECKSUM,
    STATE_FILE,
    CheckpointError,
    Files,
    optimizer_file,
    read_object,
)
from gdnctl.runtime.model.durable_files import document_checksum, make_directory, write_file, write_json


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
        raise CheckpointError(
            f"the checkpoint has {len(states)} optimizer states but this run builds "
            f"{len(subs)}; resume with the parallel settings the checkpoint was saved with."
        )
    for sub, entry in zip(subs, states, strict=True):
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
    make_directory(directory / OPTIMIZER_DIR)
    states = optimizer_state(optimizer)
    file_name = optimizer_file(rank)
    mine = {**written, file_name: write_file(directory / file_name, lambda temporary: torch.save(states, temporary))}
    everyone: list[Files] = [{} for _ in range(world_size)]
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        files = {name: record for part in everyone for name, record in part.items()}
        document = {**state, "world_size": world_size, "files": dict(sorted(files.items()))}
        write_json(directory / STATE_FILE, {**document, STATE_CHECKSUM: document_checksum(document)})


def mark_latest(save_dir: Path, name: str) -> None:
    """Point save_dir/latest at `name` (rank 0, after every rank has written: see save_training_state)."""
    write_file(save_dir / LATEST, lambda temporary: temporary.write_text(name + "\n"))


def read_training_state(directory: Path, world_size: int) -> dict:
    state = read_object(directory / STATE_FILE, MAX_STATE_BYTES)
    for key in ("iteration", "consumed_samples"):
        value = state.get(key)
        if (key == "iteration" or value is not None) and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise CheckpointError(f"{directory / STATE_FILE} has {key} {value!r}, not a count; {RESTORE}.")
    if state.get("world_size") != world_size:
        raise CheckpointError(
            f"{directory} was saved by {state.get('world_size')} ranks but this run has "
            f"{world_size}; resume with the same parallel settings."
        )
    return state


def load_training_state(directory: Path, optimizer, device: str = "cuda") -> None:
    path = directory / optimizer_file(dist.get_rank())
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
        raise CheckpointError(
            f"{path} cannot be loaded ({reason}); point {directory.parent / LATEST} at an earlier "
            f"checkpoint of {directory.parent}."
        ) from None
    if not isinstance(states, list) or not all(isinstance(entry, dict) and "state_dict" in entry for entry in states):
        raise CheckpointError(
            f"{path} holds no optimizer states of gdnctl's; point {directory.parent / LATEST} at "
            f"an earlier checkpoint of {directory.parent}."
        )
    try:
        load_optimizer_state(optimizer, states)
    except (KeyError, ValueError, TypeError, IndexError) as error:  # torch's load_state_dict on another layout
        raise CheckpointError(
            f"{path} does not fit this run's optimizer ({type(error).__name__}: {error}); resume "
            "with the model and parallel settings the checkpoint was saved with."
        ) from None
