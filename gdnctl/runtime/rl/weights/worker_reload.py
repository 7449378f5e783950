"""What vLLM's workers run (through LLM.collective_rpc; the first argument is the worker) to take in weights that
arrive in pieces rather than as a checkpoint directory: the in-memory syncs of weights/cuda_ipc.py and
weights/broadcast.py.

The reload brackets the pieces the way vLLM's own `reload_weights` brackets a checkpoint (layerwise reload:
each layer is processed, fused and repacked once all of its weights arrived): `begin_reload`, then
`load_into_model` per bucket, then `end_reload`. The model's own `load_weights` maps HF names, fuses and shards
for tensor parallel exactly as it does when vLLM reads a checkpoint.

torch at import time, vLLM only inside the functions.
"""

from __future__ import annotations

import torch


def begin_reload(worker) -> None:
    from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

    initialize_layerwise_reload(worker.model_runner.get_model())


def load_into_model(worker, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Feed HF-named tensors to the model's load_weights; returns how many."""
    worker.model_runner.get_model().load_weights(weights)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return len(weights)


def end_reload(worker) -> None:
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    finalize_layerwise_reload(worker.model_runner.get_model(), worker.model_runner.model_config)


def free_gpu_memory(worker) -> tuple[int, int]:
    """(free, total) bytes on the worker's GPU."""
    return torch.cuda.mem_get_info()
