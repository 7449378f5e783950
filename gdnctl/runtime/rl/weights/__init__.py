"""Trainer -> rollout weight syncs and their checks: the safetensors directory and the per-parameter checksums
(`sync`), the buckets both in-memory paths move (`buckets`), CUDA IPC for colocated engines (`cuda_ipc`), the
process-group broadcast for engines on GPUs of their own (`broadcast`), and what vLLM's workers run to take the
pieces in (`worker_reload`)."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "SyncCheck": "sync",
}
__all__ = [
    "SyncCheck",
    "broadcast",
    "buckets",
    "cuda_ipc",
    "sync",
    "worker_reload",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
