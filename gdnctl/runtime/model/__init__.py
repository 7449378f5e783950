"""The model: built through megatron-bridge (Transformer Engine) or gdnctl's TE-free Megatron-Core spec, HF
safetensors in and out, checkpoints (HF weights plus optimizer state) with resume, and LoRA adapters in HF
names (the `peft` layout and the merge), megatron-bridge's LoRA on the built model and the checkpoints of a LoRA
run."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "build_gpt_model": "megatron",
    "transformer_config": "megatron",
    "ShardPlace": "hf_weights",
    "padded_vocab_size": "hf_weights",
    "transformer_config_kwargs": "megatron_config",
    "make_model_builder": "builders",
    "hold_save_dir": "save_lock",
    "SaveDirInUse": "save_lock",
}
__all__ = [
    "SaveDirInUse",
    "ShardPlace",
    "bridge",
    "build_gpt_model",
    "builders",
    "checkpoint",
    "checkpoint_layout",
    "durable_files",
    "hf_weights",
    "hold_save_dir",
    "lora_adapters",
    "lora_checkpoint",
    "lora_wrap",
    "make_model_builder",
    "megatron",
    "megatron_config",
    "padded_vocab_size",
    "passthrough",
    "resume_choice",
    "save_lock",
    "training_state",
    "transformer_config",
    "transformer_config_kwargs",
    "vision_language",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
