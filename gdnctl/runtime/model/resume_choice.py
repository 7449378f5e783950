"""Choosing the checkpoint to resume from: the one save_dir/latest names when every file it recorded is there with
its size and checksum, else the newest older one that is.

`latest` and each candidate's trainer_state.json were written by an earlier run, perhaps of another gdnctl, and may
have been edited, truncated or replaced since: both are read through files.py's bounded reads and
trainer_state.json is checked against _TrainerState (files.typed) before anything is taken from it. `latest` must
name a checkpoint directory of the save dir itself (iter_N): a path elsewhere (`../other/iter_N`, an absolute
one, a link leading out) would resume another run's weights and optimizer state as this one's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath

import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field

from gdnctl.files import UnreadableFile, read_json, read_text, typed
from gdnctl.runtime.model.checkpoint_layout import (
    CHECKPOINT_NAME,
    CHECKSUM,
    LATEST,
    MAX_STATE_BYTES,
    STATE_CHECKSUM,
    STATE_FILE,
    CheckpointError,
)
from gdnctl.runtime.model.durable_files import document_checksum, file_checksum

# `latest` holds one checkpoint's name and a newline.
MAX_LATEST_BYTES = 4096


# The field names below are checkpoint_layout's CHECKSUM and STATE_CHECKSUM.
class _RecordedFile(BaseModel):
    model_config = ConfigDict(extra="allow")

    size: int = Field(ge=0)
    sha256: str


class _TrainerState(BaseModel):
    """What a resume takes from trainer_state.json (training_state.save_training_state writes it): the files and
    its own checksum. The other keys (iteration, consumed samples) are read_training_state's."""

    model_config = ConfigDict(extra="allow")

    files: dict[str, _RecordedFile]
    state_sha256: str


@dataclass(frozen=True)
class _Expected:
    """A file a checkpoint must hold, with the size and checksum recorded when it was saved."""

    name: str
    size: int
    sha256: str


def latest_checkpoint(save_dir: Path) -> Path | None:
    """The checkpoint to resume from: the one save_dir/latest names if every file it recorded is there with its
    size and checksum, else the newest older one that is (one line on stderr says which and why); None when
    there is no `latest`. Checkpoints newer than the one `latest` names are never taken: `latest` moving is what
    completes a save.

    Collective, and every rank gets the same answer: rank 0 lists the candidates and reads each one's
    trainer_state.json; the files are then checked by all ranks, each taking every world-size-th file (so the
    checkpoint is read once, in parallel), and the findings gathered to all."""
    candidates = _from_rank_zero(partial(_candidates, save_dir))
    if isinstance(candidates, str):  # raised on every rank: each waits for this answer
        raise CheckpointError(candidates)
    rejected: list[str] = []
    for directory in candidates:
        expected = _from_rank_zero(partial(_expected_files, directory))
        problem = expected if isinstance(expected, str) else _first_problem(directory, expected)
        if problem is None:
            _announce(directory, rejected)
            return directory
        rejected.append(f"checkpoint {directory.name} is {problem}")
    if rejected:
        raise CheckpointError(
            f"no checkpoint in {save_dir} can be resumed ({'; '.join(rejected)}); restore an "
            f"intact checkpoint directory there and write its name into {save_dir / LATEST}, "
            "or delete that file to start the run over."
        )
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


def _candidates(save_dir: Path) -> list[Path] | str:
    """The checkpoint `latest` names, then the older ones, newest first; or the sentence saying why `latest`
    cannot be followed."""
    marker = save_dir / LATEST
    if not marker.exists() and not marker.is_symlink():
        return []
    fix = f"write the name of a checkpoint directory of {save_dir} (iter_N) into it, or delete it to start the run over"
    try:
        name = read_text(marker, MAX_LATEST_BYTES).strip()
    except UnreadableFile as error:
        return f"{error}; {fix}."
    named = save_dir / name
    if CHECKPOINT_NAME.fullmatch(name) is None or named.is_symlink():
        return (
            f"{marker} names {name!r}, which is not a checkpoint directory of {save_dir} itself (iter_N), and a "
            f"resume takes only this save dir's own checkpoints; {fix}."
        )
    newest = _iteration(named.name)
    older = {
        iteration: path
        for path in save_dir.iterdir()
        if path.is_dir()
        and not path.is_symlink()
        and path != named
        and (iteration := _iteration(path.name)) is not None
        and (newest is None or iteration < newest)
    }
    return [named, *(older[iteration] for iteration in sorted(older, reverse=True))]


def _expected_files(directory: Path) -> list[_Expected] | str:
    """The files `directory` must hold, from its trainer_state.json, or why it cannot be resumed."""
    if not directory.is_dir():
        return f"missing ({directory} does not exist)"
    path = directory / STATE_FILE
    if not path.exists():
        return f"incomplete ({STATE_FILE} is missing)"
    try:
        state = read_json(path, MAX_STATE_BYTES)
        if not isinstance(state, dict):
            return f"corrupt ({STATE_FILE} is not a JSON object)"
        if STATE_CHECKSUM not in state:
            return f"corrupt ({STATE_FILE} records no checksum of its own)"
        recorded = typed(state, _TrainerState, STATE_FILE)
    except UnreadableFile as error:
        return f"corrupt ({str(error).replace(str(path), STATE_FILE, 1)})"
    if recorded.state_sha256 != document_checksum(state):
        return f"corrupt ({STATE_FILE} differs from its recorded checksum)"
    outside = next((name for name in recorded.files if not _inside_checkpoint(name)), None)
    if outside is not None:
        return f"corrupt ({STATE_FILE} records a file {outside!r} outside the checkpoint directory)"
    return [_Expected(name, record.size, record.sha256) for name, record in recorded.files.items()]


def _inside_checkpoint(name: str) -> bool:
    """Whether a recorded file name is a relative path that stays inside the checkpoint (optimizer/rank-N.pt is)."""
    parts = PurePosixPath(name).parts
    return bool(parts) and not PurePosixPath(name).is_absolute() and ".." not in parts and "\0" not in name


def _first_problem(directory: Path, expected: list[_Expected]) -> str | None:
    """The problem of the first failing file in `expected` order, the same on every rank (collective)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = next(
        (
            (index, problem)
            for index in range(rank, len(expected), world_size)
            if (problem := _file_problem(directory, expected[index])) is not None
        ),
        None,
    )
    everyone: list[tuple[int, str] | None] = [None] * world_size
    dist.all_gather_object(everyone, mine)
    found = [entry for entry in everyone if entry is not None]
    return min(found)[1] if found else None


def _file_problem(directory: Path, expected: _Expected) -> str | None:
    path, name = directory / expected.name, expected.name
    if not path.is_file():
        return f"incomplete ({name} is missing)"
    size = path.stat().st_size
    if size != expected.size:
        return _size_problem(name, size, expected.size)
    if file_checksum(path) != expected.sha256:
        return f"corrupt ({name}: its {CHECKSUM} differs from the one recorded when it was saved)"
    return None


def _size_problem(name: str, size: int, expected: int) -> str:
    if size < expected:
        return f"incomplete ({name}: {size:,} of {expected:,} bytes)"
    return f"corrupt ({name}: {size:,} bytes where {expected:,} were written)"


def _announce(directory: Path, rejected: list[str]) -> None:
    if dist.get_rank() == 0 and rejected:
        print(f"gdnctl: {'; '.join(rejected)}; resuming from {directory.name}", file=sys.stderr, flush=True)
