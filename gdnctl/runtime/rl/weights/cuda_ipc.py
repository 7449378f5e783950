"""In-memory weight sync for a colocated rollout: the trainer's HF tensors shared through CUDA IPC, in buckets.

The disk path (weight_sync.write_weights, then vLLM's reload from the directory) copies every weight to host
memory, through the filesystem and back. When vLLM runs on the trainer's GPUs the weights are already where
they must go: each trainer rank packs HF tensors into a flat GPU buffer (a bucket, weights/buckets.py), shares the
buffer's CUDA IPC handle, and the vLLM worker on the same GPU (matched by the GPU's UUID) maps it, copies the
tensors out and feeds them to the model's own `load_weights`, so vLLM's name mapping, fusing and
tensor-parallel sharding apply exactly as they do when it reads a checkpoint. Buckets bound the extra memory on
both sides to one bucket; the trainer frees a bucket only after the rollout answered that it has loaded it.

The buckets go inside weights/worker_reload.py's bracket (`begin_reload`, `load_bucket` per bucket, `end_reload`, as
vLLM's layerwise reload processes each layer once all of its weights arrived). The worker copies each tensor
out of the shared buffer because the layerwise loader keeps what it is given until the layer is complete, which
can be after the trainer has moved on to the next bucket.

This module runs on both sides (the rollout server imports it in vLLM's environment, and vLLM's workers run its
functions through collective_rpc): torch and stdlib only.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from gdnctl.runtime.rl.weights import buckets as packing
from gdnctl.runtime.rl.weights.worker_reload import load_into_model


def buckets(tensors):
    """The trainer's HF tensors in buckets whose memory the classic CUDA IPC handle can share."""
    return packing.buckets(tensors, allocate=_shareable_empty)


def _shareable_empty(nbytes: int, device: torch.device) -> torch.Tensor:
    with _ipc_shareable_allocations(device):
        return torch.empty(nbytes, dtype=torch.uint8, device=device)


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


def load_bucket(worker, shared: dict[str, tuple], wire_entries: list[tuple]) -> int:
    """Load one bucket (Bucket.wire_entries) from the trainer rank on this worker's GPU; returns how many
    tensors it held."""
    args = shared.get(device_uuid())
    if args is None:
        raise RuntimeError(
            f"no trainer rank shared weights on this worker's GPU {device_uuid()} (shared: "
            f"{', '.join(sorted(shared))}); CUDA IPC needs the rollout on the trainer's GPUs"
        )
    buffer = open_shared(args)
    weights = packing.copies(buffer, packing.entries_from_wire(wire_entries))
    torch.cuda.synchronize()  # the copies are done before the mapping closes and the trainer may free it
    del buffer
    return load_into_model(worker, weights)
