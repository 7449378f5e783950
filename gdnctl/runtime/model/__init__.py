"""The model: Megatron-Core's GDN model built without Transformer Engine, HF safetensors in and out, and
checkpoints (HF weights plus optimizer state) with resume."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {"build_gpt_model": "megatron", "transformer_config": "megatron", "ShardPlace": "hf_weights",
    "padded_vocab_size": "hf_weights", "transformer_config_kwargs": "megatron_config"}
__all__ = ["ShardPlace", "build_gpt_model", "checkpoint", "hf_weights", "megatron", "megatron_config",
           "padded_vocab_size", "transformer_config", "transformer_config_kwargs"]
__getattr__ = lazy_attributes(__name__, _HOMES)
