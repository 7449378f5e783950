"""The trainer's HF tensors packed into flat byte buffers (buckets), the unit both in-memory weight syncs move.

CUDA IPC (weights/cuda_ipc.py) shares a bucket's memory with the vLLM worker on the same GPU; the broadcast
(weights/broadcast.py) sends it over a process group to every rollout worker. Either way the receiver rebuilds the
tensors from the bucket's entries (Bucket.wire_entries) and feeds them to the model's own `load_weights`.
Buckets bound the extra memory on both sides to one bucket at a time.

torch and stdlib only: this module runs in the trainer and, through vLLM's collective_rpc, in vLLM's workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

# 512 MiB: a 35B-A3B's largest single tensor (the 248k x 2048 embedding, 1 GiB in bf16) gets a bucket of its
# own; the rest go ~a layer's experts at a time. One bucket is what either side holds beyond its model.
BUCKET_BYTES = 512 << 20
# Every tensor starts at a multiple of this in the bucket, so its view is aligned for any dtype and kernel.
_ALIGNMENT = 256


@dataclass(frozen=True)
class Entry:
    """Where one HF tensor lies in a bucket."""

    name: str
    dtype: str  # torch dtype name, e.g. "bfloat16"
    shape: tuple[int, ...]
    offset: int  # bytes from the bucket's start
    nbytes: int


@dataclass
class Bucket:
    buffer: torch.Tensor  # flat uint8
    entries: list[Entry]

    def wire_entries(self) -> list[tuple]:
        """The entries as plain tuples: vLLM's RPC transport turns dataclasses into dicts on the way."""
        return [(e.name, e.dtype, list(e.shape), e.offset, e.nbytes) for e in self.entries]

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The entries as views of the buffer."""
        return views(self.buffer, self.entries)


def entries_from_wire(wire_entries: list[tuple]) -> list[Entry]:
    return [Entry(name, dtype, tuple(shape), offset, nbytes) for name, dtype, shape, offset, nbytes in wire_entries]


def views(buffer: torch.Tensor, entries: list[Entry]) -> Iterator[tuple[str, torch.Tensor]]:
    for entry in entries:
        yield entry.name, view(buffer, entry)


def copies(buffer: torch.Tensor, entries: list[Entry]) -> list[tuple[str, torch.Tensor]]:
    """Each entry copied out of `buffer`: vLLM's layerwise loader keeps what it is given until a layer is
    complete, which can be after the buffer was reused or freed."""
    return [(entry.name, view(buffer, entry).clone()) for entry in entries]


def view(buffer: torch.Tensor, entry: Entry) -> torch.Tensor:
    return buffer[entry.offset : entry.offset + entry.nbytes].view(getattr(torch, entry.dtype)).view(entry.shape)


def buckets(
    tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype = torch.bfloat16,
    bucket_bytes: int = BUCKET_BYTES,
    allocate: Callable[[int, torch.device], torch.Tensor] | None = None,
) -> Iterator[Bucket]:
    """Pack HF-named tensors, cast to `dtype`, into flat buffers of at most `bucket_bytes` (a larger tensor gets
    one of its own), on the tensors' device; `allocate(nbytes, device)` makes each buffer (default: a plain
    torch.empty). Each bucket is yielded once full; the caller sends it and drops it before the next is packed,
    so only one exists at a time."""
    pending: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in tensors:
        tensor = tensor.detach().to(dtype)
        nbytes = tensor.numel() * tensor.element_size()
        if pending and size + nbytes > bucket_bytes:
            yield _pack(pending, size, allocate or _empty)
            pending, size = [], 0
        pending.append((name, tensor))
        size += _aligned(nbytes)
    if pending:
        yield _pack(pending, size, allocate or _empty)


def _empty(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGNMENT) * _ALIGNMENT


def _pack(
    tensors: list[tuple[str, torch.Tensor]], size: int, allocate: Callable[[int, torch.device], torch.Tensor]
) -> Bucket:
    buffer = allocate(size, tensors[0][1].device)
    entries, offset = [], 0
    for name, tensor in tensors:
        entry = Entry(
            name,
            str(tensor.dtype).removeprefix("torch."),
            tuple(tensor.shape),
            offset,
            tensor.numel() * tensor.element_size(),
        )
        view(buffer, entry).copy_(tensor)
        entries.append(entry)
        offset += _aligned(entry.nbytes)
    return Bucket(buffer, entries)
