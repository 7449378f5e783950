"""What every HF save of a run carries over, unchanged, from the checkpoint its weights came from.

gdnctl trains the language model. A Qwen3.5 release holds more: an MTP head (`mtp.*`, which vLLM runs for
speculative decoding) and, in the vision-language classes, a vision tower (`model.visual.*`), with the language
model stored under `model.language_model.`. A save reproduces that source checkpoint with the trained tensors
swapped in:

- the trained tensors under the names the source stores them by (a vision-language source comes back as a
  vision-language checkpoint, a text-only one as text-only);
- every other tensor of the source (the MTP head, the vision tower, anything the text model has no parameter
  for) copied byte for byte into one extra file, PASSTHROUGH_FILE, listed in the index under its own name;
- the source's config.json as it is: training changes none of its keys, so mtp_num_hidden_layers, vision_config
  and the vision-language architecture stay.

The source is the checkpoint the run loaded its weights from: the one it resumed from (a gdnctl save, which
already carries them), else model.path. A run from random weights has none, and its saves are the text-only
class (checkpoint.hf_text_config), as is the rollout's weight-sync export, which vLLM serves text-only.

The copy reads and writes the safetensors format itself (8 bytes of little-endian header length, the JSON
header, then the tensors' bytes), without torch: no tensor is decoded, none is held in memory whole (a large
MoE's MTP layer holds all its experts), and the bytes cannot change on the way.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, NonNegativeInt, conlist

from gdnctl.errors import GdnctlError
from gdnctl.files import UnreadableFile, decode_json, open_regular, typed
from gdnctl.runtime.model.hf_weights import VISION_PREFIX, canonical_hf_name

PASSTHROUGH_FILE = "passthrough.safetensors"
# A tied model's LM head is its embedding: a source may still store a copy, which is stale once the embedding
# trains, and loaders that read it (vLLM loads an `lm_head.weight` it finds into the tied parameter) would
# serve it instead of the trained embedding. An untied model writes its own.
_NEVER_CARRIED = ("lm_head.weight",)
_COPY_CHUNK_BYTES = 64 << 20
_HEADER_ALIGNMENT = 8  # the safetensors writer pads its header with spaces to a multiple of 8 bytes
# safetensors refuses a header longer than this (its MAX_HEADER_SIZE, 100,000,000 bytes).
MAX_HEADER_BYTES = 100_000_000
# The source was read when the run loaded its weights; a save that finds it different cannot carry it over.
_CHANGED = (
    "The checkpoint the run loaded its weights from (model.path, or the checkpoint it resumed from) was "
    "changed after the run read it; restore it and relaunch."
)


class SourceCheckpointError(GdnctlError):
    """A tensor of the source checkpoint cannot be carried into a save."""


@dataclass(frozen=True)
class HFSource:
    """The checkpoint a run's saves reproduce.

    `config`: the config.json every save writes. `stored_names`: text-model name (as gdnctl's writers name a
    tensor) -> the name the source stores it under. `files`: every tensor of the source by its stored name ->
    the safetensors file holding it."""

    config: dict
    stored_names: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, Path] = field(default_factory=dict)
    # Without a source checkpoint to name them: where a vision-language class keeps its language model
    # (checkpoint.rollout_source), replacing the text model's "model.".
    language_model_prefix: str = ""

    def stored_name(self, name: str) -> str:
        """The name a save stores a trained tensor under: the source's own name for it."""
        if name in self.stored_names:
            return self.stored_names[name]
        # The vision tower keeps its own names: it sits beside the language model, not under it.
        if self.language_model_prefix and name.startswith("model.") and not name.startswith(VISION_PREFIX):
            return self.language_model_prefix + name[len("model.") :]
        return name

    @property
    def has_vision_tower(self) -> bool:
        return any(name.startswith(VISION_PREFIX) for name in self.files)

    def passthrough(self, written: Iterable[str]) -> dict[str, Path]:
        """The source's tensors a save carries over (stored name -> file): every one it does not write itself."""
        written = set(written)
        return {
            name: path
            for name, path in sorted(self.files.items())
            if name not in written and canonical_hf_name(name) not in _NEVER_CARRIED
        }


def source_checkpoint(directory: Path, config: dict, weight_map: Mapping[str, str]) -> HFSource:
    """The HF checkpoint in `directory` (its config.json and its index's tensor name -> file) as a source."""
    stored_names = {canonical: stored for stored in weight_map if (canonical := canonical_hf_name(stored)) is not None}
    return HFSource(config, stored_names, {name: directory / file for name, file in weight_map.items()})


def write_passthrough(tensors: Mapping[str, Path], target: Path) -> None:
    """Write `tensors` (stored name -> the safetensors file holding it) as one safetensors file at `target`,
    sorted by name, each tensor's dtype, shape and bytes as its source file has them."""
    headers = {path: _read_header(path) for path in set(tensors.values())}
    pieces = [_piece(name, tensors[name], *headers[tensors[name]]) for name in sorted(tensors)]
    entries, offset = {}, 0
    for piece in pieces:
        entries[piece.name] = {
            "dtype": piece.dtype,
            "shape": piece.shape,
            "data_offsets": [offset, offset + piece.length],
        }
        offset += piece.length
    header = json.dumps({"__metadata__": {"format": "pt"}, **entries}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % _HEADER_ALIGNMENT)
    with target.open("wb") as out, ExitStack() as stack:
        out.write(struct.pack("<Q", len(header)) + header)
        handles = {path: stack.enter_context(path.open("rb")) for path in headers}
        for piece in pieces:
            handles[piece.path].seek(piece.start)
            _copy_bytes(handles[piece.path], out, piece)


@dataclass(frozen=True)
class _Piece:
    """One tensor's bytes in its source file: `start` is the absolute offset."""

    name: str
    path: Path
    start: int
    length: int
    dtype: str
    shape: list[int]


class _TensorEntry(BaseModel):
    """A tensor's entry in a safetensors header, as the copy uses it."""

    model_config = ConfigDict(extra="allow")

    dtype: str
    shape: list[int]
    data_offsets: conlist(NonNegativeInt, min_length=2, max_length=2)  # type: ignore[valid-type]


def _read_header(path: Path) -> tuple[int, dict]:
    """(where the tensor data starts, the JSON header) of a safetensors file: the length within the file and
    safetensors' own bound, the header decoded as files.decode_json does and each tensor's entry checked."""
    try:
        with os.fdopen(open_regular(path)[0], "rb") as handle:  # a FIFO at the name would block a plain open
            prefix = handle.read(8)
            length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
            if length is None or length > min(MAX_HEADER_BYTES, os.fstat(handle.fileno()).st_size - 8):
                raise UnreadableFile(f"{path} has no safetensors header of a possible length")
            header = decode_json(handle.read(length), str(path))
        if not isinstance(header, dict):
            raise UnreadableFile(f"{path}'s safetensors header is not a JSON object")
        tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
        typed(tensors, dict[str, _TensorEntry], f"{path}'s safetensors header")
    except (OSError, UnreadableFile) as error:
        reason = error if isinstance(error, UnreadableFile) else f"{path} cannot be read ({error.strerror})"
        raise SourceCheckpointError(f"{reason}. {_CHANGED}") from None
    return 8 + length, header


def _piece(name: str, path: Path, data_start: int, header: dict) -> _Piece:
    if name not in header:
        raise SourceCheckpointError(f"{path} no longer holds the tensor {name} that its index names. {_CHANGED}")
    begin, end = header[name]["data_offsets"]
    if end < begin:
        raise SourceCheckpointError(f"{path} gives {name} data offsets that end before they start. {_CHANGED}")
    return _Piece(name, path, data_start + begin, end - begin, header[name]["dtype"], header[name]["shape"])


def _copy_bytes(source: BinaryIO, target: BinaryIO, piece: _Piece) -> None:
    left = piece.length
    while left:
        chunk = source.read(min(left, _COPY_CHUNK_BYTES))
        if not chunk:
            raise SourceCheckpointError(f"{piece.path} ends inside its tensor {piece.name}. {_CHANGED}")
        target.write(chunk)
        left -= len(chunk)
