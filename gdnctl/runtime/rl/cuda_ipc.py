"""In-memory weight sync for a colocated rollout: the trainer's HF tensors shared through CUDA IPC, in buckets.

The disk path (weight_sync.write_weights, then vLLM's reload from the directory) copies every weight to host
memory, through the filesystem and back. When vLLM runs on the trainer's GPUs the weights are already where
they must go: each trainer rank packs HF tensors into a flat GPU buffer (a bucket), shares the buffer's CUDA
IPC handle, and the vLLM worker on the same GPU (matched by the GPU's UUID) maps it, copies the tensors out
and feeds them to the model's own `load_weights`, so vLLM's name mapping, fusing and tensor-parallel sharding
apply exactly as they do when it reads a checkpoint. Buckets bound the extra memory on both sides to one
bucket; the trainer frees a bucket only after the rollout answered that it has loaded it.

The reload brackets the buckets the way vLLM's own `reload_weights` brackets a checkpoint (layerwise reload:
each layer is processed once all of its weights arrived): `begin_reload`, `load_bucket` per bucket,
`end_reload`. The worker copies each tensor out of the shared buffer because the layerwise loader keeps what it
is given until the layer is complete, which can be after the trainer has moved on to the next bucket.

This module runs on both sides (the rollout server imports it in vLLM's environment, and vLLM's workers run its
functions through collective_rpc): torch and stdlib at import time, vLLM only inside the worker functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
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
    buffer: torch.Tensor  # flat uint8 on this rank's GPU
    entries: list[Entry]

    def wire_entries(self) -> list[tuple]:
        """The entries as plain tuples: vLLM's RPC transport turns dataclasses into dicts on the way."""
        return [(e.name, e.dtype, list(e.shape), e.offset, e.nbytes) for e in self.entries]

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The entries as views of the buffer."""
        for entry in self.entries:
            yield entry.name, view(self.buffer, entry)


def view(buffer: torch.Tensor, entry: Entry) -> torch.Tensor:
    return buffer[entry.offset:entry.offset + entry.nbytes].view(getattr(torch, entry.dtype)).view(entry.shape)


def buckets(tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype = torch.bfloat16,
            bucket_bytes: int = BUCKET_BYTES) -> Iterator[Bucket]:
    """Pack HF-named tensors, cast to `dtype`, into flat buffers of at most `bucket_bytes` (a larger tensor gets
    one of its own), on the tensors' device. Each bucket is yielded once full; the caller shares it, waits for
    the rollout, and drops it before the next is packed, so only one exists at a time."""
    pending: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in tensors:
        tensor = tensor.detach().to(dtype)
        nbytes = tensor.numel() * tensor.element_size()
        if pending and size + nbytes > bucket_bytes:
            yield _pack(pending, size)
            pending, size = [], 0
        pending.append((name, tensor))
        size += _aligned(nbytes)
    if pending:
        yield _pack(pending, size)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGNMENT) * _ALIGNMENT


def _pack(tensors: list[tuple[str, torch.Tensor]], size: int) -> Bucket:
    device = tensors[0][1].device
    with _ipc_shareable_allocations(device):
        buffer = torch.empty(size, dtype=torch.uint8, device=device)
    entries, offset = [], 0
    for name, tensor in tensors:
        entry = Entry(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset,
                      tensor.numel() * tensor.element_size())
        view(buffer, entry).copy_(tensor)
        entries.append(entry)
        offset += _aligned(entry.nbytes)
    return Bucket(buffer, entries)


@contextmanager
def _ipc_shareable_allocations(device: torch.device):
    """Allocate from ordinary segments: gdnctl's trainers run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    (fewer fragmentation OOMs), and memory of an expandable segment is not shared by the classic IPC handle that
    vLLM's worker opens (vLLM switches the setting off the same way around its own pool:
    vllm/device_allocator/cumem.py)."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.memory._set_allocator_settings("expandable_segments:False")
    try:
        yield
    finally:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")


# --- the handle ------------------------------------------------------------------------------------------------

def device_uuid(device: int | None = None) -> str:
    """The GPU's UUID: how a vLLM worker finds the trainer rank on its own GPU, whatever each process numbers
    it (CUDA_VISIBLE_DEVICES may differ between them)."""
    index = torch.cuda.current_device() if device is None else device
    return str(torch.cuda.get_device_properties(index).uuid)


def share(buffer: torch.Tensor) -> tuple:
    """The picklable CUDA IPC handle of `buffer` (torch's own reduction, as torch.multiprocessing sends it)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

    rebuild, args = reduce_tensor(buffer)
    if rebuild is not rebuild_cuda_tensor:
        raise TypeError(f"a bucket on {buffer.device} cannot be shared through CUDA IPC")
    return args


def open_shared(args: tuple) -> torch.Tensor:
    """The shared buffer, mapped into this process on its current GPU (args[6] is the producer's device index,
    which may be numbered differently here)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = list(args)
    args[6] = torch.cuda.current_device()
    return rebuild_cuda_tensor(*args)


# --- rollout side: run inside vLLM's workers through LLM.collective_rpc (the first argument is the worker) -----

def begin_reload(worker) -> None:
    from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

    initialize_layerwise_reload(worker.model_runner.get_model())


def load_bucket(worker, shared: dict[str, tuple], wire_entries: list[tuple]) -> int:
    """Load one bucket (Bucket.wire_entries) from the trainer rank on this worker's GPU; returns how many
    tensors it held."""
    entries = [Entry(name, dtype, tuple(shape), offset, nbytes) for name, dtype, shape, offset, nbytes in wire_entries]
    args = shared.get(device_uuid())
    if args is None:
        raise RuntimeError(f"no trainer rank shared weights on this worker's GPU {device_uuid()} (shared: "
                           f"{', '.join(sorted(shared))}); CUDA IPC needs the rollout on the trainer's GPUs")
    buffer = open_shared(args)
    weights = [(entry.name, view(buffer, entry).clone()) for entry in entries]
    torch.cuda.synchronize()  # the copies are done before the mapping closes and the trainer may free it
    del buffer
    worker.model_runner.get_model().load_weights(weights)
    torch.cuda.synchronize()
    return len(weights)


def end_reload(worker) -> None:
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    finalize_layerwise_reload(worker.model_runner.get_model(), worker.model_runner.model_config)


def free_gpu_memory(worker) -> tuple[int, int]:
    """(free, total) bytes on the worker's GPU."""
    return torch.cuda.mem_get_info()
