"""gdnctl: validate, render and launch Qwen3.5 Gated-DeltaNet jobs on Megatron + vLLM."""

__version__ = "0.1.0"
