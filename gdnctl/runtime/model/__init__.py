"""The model: Megatron-Core's GDN model built without Transformer Engine, HF safetensors in and out, and
checkpoints (HF weights plus optimizer state) with resume."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {"build_gpt_model": "megatron", "transformer_config": "megatron", "ShardPlace": "hf_weights",
    "padded_vocab_size": "hf_weights"}
__all__ = ["ShardPlace", "build_gpt_model", "checkpoint", "hf_weights", "megatron", "padded_vocab_size",
           "transformer_config"]
__getattr__ = lazy_attributes(__name__, _HOMES)
