"""What a checkpoint directory holds (see checkpoint.py for the layout), its file names and bounds, the error its
readers raise, and the bounded JSON read they share."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from gdnctl.errors import GdnctlError
from gdnctl.files import UnreadableFile, read_json

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


RESTORE = "restore the checkpoint's files, or point model.path (or save_dir/latest) at a whole checkpoint"


def read_object(path: Path, limit: int) -> dict:
    """A JSON object file of a checkpoint; CheckpointError naming it otherwise."""
    try:
        document = read_json(path, limit)
    except UnreadableFile as error:
        raise CheckpointError(f"{error}; {RESTORE}.") from None
    if not isinstance(document, dict):
        raise CheckpointError(f"{path} is not a JSON object; {RESTORE}.")
    return document


def check_source_outside_save_dir(model_path: str | None, save_dir: str | None) -> None:
    """CheckpointError, before the job starts, when model.path lies in train.save_dir: a save there
    (save_dir/iter_N) would replace the very checkpoint the job starts from, and a resume, which reads model.path
    again (the rl job's KL reference, a LoRA run's base), would read the job's own weights as the original's."""
    if not model_path or not save_dir:
        return
    source, saves = Path(os.path.realpath(model_path)), Path(os.path.realpath(save_dir))
    if source == saves or source.is_relative_to(saves):
        raise CheckpointError(
            f"model.path {model_path} is inside train.save_dir {save_dir}, where this job's saves would replace "
            "the checkpoint it starts from (and a resume, which reads model.path again, would take the job's own "
            "weights for it); copy that checkpoint out of the save dir and point model.path at the copy, or give "
            "this run another train.save_dir."
        )


def refuse_overwriting_source(directory: Path, sources: Iterable[Path | None]) -> None:
    """CheckpointError before a save writes into `directory` when it is a directory the job reads weights from
    (model.path, the checkpoint it resumed from): a save renames its new files over the ones there."""
    target = os.path.realpath(directory)
    for source in sources:
        if source is not None and os.path.realpath(source) == target:
            raise CheckpointError(
                f"a save into {directory} would replace the checkpoint this job reads its weights from ({source}); "
                "point model.path at a checkpoint outside train.save_dir, or give this run another train.save_dir."
            )


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def optimizer_file(rank: int) -> str:
    return f"{OPTIMIZER_DIR}/rank-{rank:05d}.pt"
