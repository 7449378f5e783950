"""A tiny CPU engine config for runtime tests, built through EngineConfig so it is what render would write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gdnctl.schema.comm_ops import DEFAULT_SKIP_OPS
from gdnctl.schema.engine import EngineConfig

WORLD_SIZE = 2


def tiny_engine_config(**overrides: Any) -> EngineConfig:
    """A 2-rank CPU selftest config; `overrides` replace whole top-level sections or values."""
    document: dict[str, Any] = {
        "gdnctl_version": "0.1.0",
        "name": "tiny-cpu-selftest",
        "job": "selftest",
        "device": "cpu",
        "model": {
            "id": None,
            "path": None,
            "model_type": "qwen3_5_text",
            "architecture": "Qwen3_5ForCausalLM",
            "num_layers": 4,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 4,
            "full_attention_interval": 4,
            "vocab_size": 512,
            "tie_word_embeddings": True,
            "ffn_hidden_size": 128,
            "num_experts": None,
            "num_experts_per_tok": None,
            "moe_ffn_hidden_size": None,
            "shared_expert_ffn_hidden_size": None,
            "mtp_num_layers": 0,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "released": False,
        },
        "parallel": {
            "nodes": 1,
            "gpus_per_node": WORLD_SIZE,
            "world_size": WORLD_SIZE,
            "tp": 1,
            "pp": 1,
            "cp": WORLD_SIZE,
            "ep": 1,
            "etp": 1,
            "vpp": None,
            "dp": 1,
            "sequence_parallel": False,
        },
        "layout": "thd",
        "train": {
            "precision": "bf16",
            "model_builder": "te-free",
            "model_builder_reason": "runtime.transformer_engine is none",
            "lora": None,
            "micro_batch_size": 1,
            "global_batch_size": 2,
            "seq_length": 128,
            "num_microbatches": 2,
            "lr": 1e-4,
            "train_iters": 1,
            "seed": 1234,
            "recompute": "none",
            "optimizer_cpu_offload": False,
            "distributed_optimizer": True,
            "data_path": None,
            "tokenizer_path": None,
            "save_dir": None,
            "save_interval": None,
        },
        "kernels": {"gdn_backend": "flashqla", "torch_compile": False},
        "comm": {
            "memory_guard": True,
            "free_gb_threshold": 3.0,
            "skip_ops": list(DEFAULT_SKIP_OPS),
            "profile": True,
            "profile_dir": "comm_profile",
        },
        "rollout": None,
        "grpo": None,
        "selftest": {"steps": 2},
        "metrics": {"peak_bf16_tflops": None, "wandb_project": None, "wandb_entity": None, "wandb_mode": None},
        "estimate": {"peak_memory_gib": None, "overhead_gib": None},
        "runtime_versions": {},
        "env": {},
    }
    document.update(overrides)
    return EngineConfig.model_validate(document)


def write_engine_yaml(run_dir: Path, config: EngineConfig) -> Path:
    path = run_dir / "engine.yaml"
    path.write_text(config.to_yaml())
    return path
