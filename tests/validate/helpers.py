"""Building runs from plain dicts: a shipped preset with a few fields changed."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gdnctl.plan import run as facts
from gdnctl.resources import presets_dir
from gdnctl.schema.preset import Preset
from gdnctl.validate import rules
from gdnctl.validate.loader import deep_merge

BASE = "qwen3.5-35b-a3b-grpo"


def shipped(name: str = BASE) -> dict:
    return yaml.safe_load((presets_dir() / f"{name}.yaml").read_text())


def run_of(changes: dict | None = None, base: str = BASE) -> facts.Run:
    data = deep_merge(shipped(base), changes or {})
    data.pop("base", None)
    data.pop("description", None)
    return facts.resolve(Preset.model_validate(data))


def codes(changes: dict | None = None, base: str = BASE) -> dict[str, list]:
    """code -> findings of that code."""
    out: dict[str, list] = {}
    for finding in rules.check(run_of(changes, base)):
        out.setdefault(finding.code, []).append(finding)
    return out


# A tiny Qwen3.5-MoE text config (HF keys): the rule tests' checkpoint and the config-agreement test's base.
TINY_MOE_TEXT = {
    "model_type": "qwen3_5_moe_text",
    "num_hidden_layers": 8,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "vocab_size": 1024,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "mtp_num_hidden_layers": 1,
}


def write_checkpoint(directory: Path, **text_config) -> Path:
    """A local checkpoint dir whose config.json is a Qwen3.5-style VL config with `text_config` overrides."""
    text = {**TINY_MOE_TEXT, **text_config}
    architectures = text.pop("architectures", ["Qwen3_5MoeForConditionalGeneration"])
    config = {
        "architectures": architectures,
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "tie_word_embeddings": False,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory
