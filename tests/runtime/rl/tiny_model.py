"""A random HF checkpoint of a byte-level tiny model (gdnctl/tiny-qwen3.5-bytes by default, or its MoE and
Qwen3-Next siblings), written the way the rl trainer writes its weights for the rollout: bf16 safetensors under
checkpoint names (experts one by one) and config.json, a tied LM head left out."""

from __future__ import annotations

from pathlib import Path

import torch

DENSE = "gdnctl/tiny-qwen3.5-bytes"


def model_classes(model_id: str = DENSE):
    """(architecture, transformers config class, transformers model class) of a catalog model."""
    from gdnctl.knowledge.catalog import from_catalog
    from gdnctl.runtime.rl.torch_policy import hf_model_classes

    arch = from_catalog(model_id)
    return (arch, *hf_model_classes(arch))


def random_checkpoint(directory: Path, seed: int, init_std: float | None = None,
                      model_id: str = DENSE) -> dict[str, torch.Tensor]:
    """Write the checkpoint; returns its tensors as written. `init_std` overrides transformers' initializer
    range (larger values give the peaky logits of a trained model)."""
    from gdnctl.runtime.model.checkpoint import hf_text_config
    from gdnctl.runtime.rl.torch_policy import per_expert
    from gdnctl.runtime.rl.weight_sync import write_weights

    arch, config_class, model_class = model_classes(model_id)
    config = hf_text_config(arch)
    torch.manual_seed(seed)
    init = {} if init_std is None else {"initializer_range": init_std}
    model = model_class(config_class(**config, **init))
    tied = arch.tie_word_embeddings
    tensors = (pair for name, tensor in model.state_dict().items() if not (tied and name == "lm_head.weight")
               for pair in per_expert(name, tensor))
    return write_weights(tensors, directory, config=config)
