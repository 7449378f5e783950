"""Trainer -> rollout weight syncs and their checks: the safetensors directory and the per-parameter checksums
(`sync`), the buckets both in-memory paths move (`buckets`), CUDA IPC for colocated engines (`cuda_ipc`), the
process-group broadcast for engines on GPUs of their own (`broadcast`), what vLLM's workers run to take the
pieces in (`worker_reload`), and the files beside the weights that vLLM's input processor reads for image prompts
(`processor_files`)."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "SyncCheck": "sync",
    "processor_files": "processor_files",
}
__all__ = [
    "SyncCheck",
    "broadcast",
    "buckets",
    "cuda_ipc",
    "processor_files",
    "sync",
    "worker_reload",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
