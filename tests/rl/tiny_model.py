"""A random HF checkpoint of the byte-level tiny Qwen3.5 (gdnctl/tiny-qwen3.5-bytes), written the way the rl
trainer writes its weights for the rollout: bf16 safetensors and config.json, the tied LM head left out."""

from __future__ import annotations

from pathlib import Path

import torch


def random_checkpoint(directory: Path, seed: int, init_std: float | None = None) -> dict[str, torch.Tensor]:
    """Write the checkpoint; returns its tensors as written. `init_std` overrides transformers' initializer
    range (larger values give the peaky logits of a trained model)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from gdnctl.catalog import from_catalog
    from gdnctl.runtime.checkpoint import hf_text_config
    from gdnctl.runtime.weight_sync import write_weights

    config = hf_text_config(from_catalog("gdnctl/tiny-qwen3.5-bytes"))
    torch.manual_seed(seed)
    init = {} if init_std is None else {"initializer_range": init_std}
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**config, **init))
    tensors = ((name, tensor) for name, tensor in model.state_dict().items() if name != "lm_head.weight")
    return write_weights(tensors, directory, config=config)
