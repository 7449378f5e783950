"""Model architecture facts: the shipped catalog (catalog.yaml) or a local checkpoint's config.json."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path

import yaml

from gdnctl.knowledge.model_arch import ModelArch

_CATALOG_FILE = Path(__file__).with_name("catalog.yaml")


class ModelNotFound(ValueError):
    """The model id is not in the catalog, or the checkpoint's config.json cannot be used."""


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict, dict[str, dict]]:
    data = yaml.safe_load(_CATALOG_FILE.read_text())
    return data["defaults"], data["models"]


def catalog_ids() -> list[str]:
    return list(_catalog()[1])


def _canonical_id(model_id: str) -> str | None:
    """Match case-insensitively and with or without the `Qwen/` organisation prefix."""
    wanted = model_id.lower().removeprefix("qwen/")
    for known in catalog_ids():
        if known.lower().removeprefix("qwen/") == wanted:
            return known
    return None


def from_catalog(model_id: str) -> ModelArch:
    canonical = _canonical_id(model_id)
    if canonical is None:
        close = difflib.get_close_matches(model_id, catalog_ids(), n=1, cutoff=0.6)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ModelNotFound(
            f"'{model_id}' is not in the model catalog.{hint} Known ids: {', '.join(catalog_ids())}; "
            "or set model.path to a local checkpoint directory with a config.json."
        )
    defaults, models = _catalog()
    return ModelArch(id=canonical, path=None, **{**defaults, **models[canonical]})


# HF config.json key -> ModelArch field. Qwen3.5 vision-language configs nest the language model under
# `text_config`; text-only and Qwen3-Next configs are flat.
HF_CONFIG_KEYS = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "linear_num_key_heads": "linear_num_key_heads",
    "linear_num_value_heads": "linear_num_value_heads",
    "linear_key_head_dim": "linear_key_head_dim",
    "linear_value_head_dim": "linear_value_head_dim",
    "linear_conv_kernel_dim": "linear_conv_kernel_dim",
    "full_attention_interval": "full_attention_interval",
    "vocab_size": "vocab_size",
    "intermediate_size": "ffn_hidden_size",
    "num_experts": "num_experts",
    "num_experts_per_tok": "num_experts_per_tok",
    "moe_intermediate_size": "moe_ffn_hidden_size",
    "shared_expert_intermediate_size": "shared_expert_ffn_hidden_size",
    "mtp_num_hidden_layers": "mtp_num_layers",
    "rms_norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "partial_rotary_factor": "partial_rotary_factor",
}
# transformers >= 5 writes the rope settings under `rope_parameters` instead of the top level.
ROPE_KEYS = ("rope_theta", "partial_rotary_factor")
_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
             "linear_num_key_heads", "linear_num_value_heads")


def _full_attention_interval(text: dict) -> int | None:
    layer_types = text.get("layer_types")
    if not layer_types:
        return text.get("full_attention_interval")
    full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    if not full:
        return None
    return full[0] + 1


def from_checkpoint(path: str, fallback_id: str | None = None) -> ModelArch:
    """Read `<path>/config.json`; fields it lacks come from the catalog entry of `fallback_id`."""
    config_file = Path(path).expanduser() / "config.json"
    try:
        raw = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise ModelNotFound(f"{config_file} does not exist: model.path must be a checkpoint directory "
                            "with a config.json") from None
    except (OSError, ValueError) as err:  # ValueError: bad JSON, bad UTF-8, an integer of thousands of digits
        raise ModelNotFound(f"{config_file} cannot be read as JSON ({err}).") from None
    if not isinstance(raw, dict):
        raise ModelNotFound(f"{config_file} is not a JSON object.")
    base = from_catalog(fallback_id).model_dump() if fallback_id is not None else dict(_catalog()[0])
    try:
        fields = _fields_of(raw, base)
    except (TypeError, ValueError, ArithmeticError, AttributeError, IndexError) as err:
        # a hand-edited or hostile config.json (a count of 0, a list where a number belongs): a sentence, no trace
        raise ModelNotFound(f"{config_file} has values gdnctl cannot use ({type(err).__name__}: {err}).") from None
    missing = [name for name in _REQUIRED if fields.get(name) is None]
    if missing:
        raise ModelNotFound(f"{config_file} lacks {', '.join(missing)}: is this a Qwen3.5 or Qwen3-Next "
                            "(Gated DeltaNet) checkpoint?")
    fields["path"] = str(path)
    fields["id"] = fallback_id and _canonical_id(fallback_id)
    try:
        return ModelArch(**fields)
    except ValueError as err:
        raise ModelNotFound(f"{config_file} has values gdnctl cannot use: {err}") from None


def _fields_of(raw: dict, base: dict) -> dict:
    """ModelArch's fields from a config.json (its text_config when nested) over `base` (catalog values)."""
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    fields = dict(base)
    for hf_key, field in HF_CONFIG_KEYS.items():
        if text.get(hf_key) is not None:
            fields[field] = text[hf_key]
    rope = text.get("rope_parameters")
    if isinstance(rope, dict):
        for key in ROPE_KEYS:
            if rope.get(key) is not None:
                fields[key] = rope[key]
    interval = _full_attention_interval(text)
    if interval:
        fields["full_attention_interval"] = interval
    if "head_dim" not in text and text.get("hidden_size") and text.get("num_attention_heads"):
        fields.setdefault("head_dim", text["hidden_size"] // text["num_attention_heads"])
    tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings"))
    if tie is not None:
        fields["tie_word_embeddings"] = bool(tie)
    fields.setdefault("tie_word_embeddings", False)
    architectures = raw.get("architectures") or []
    fields["architecture"] = architectures[0] if architectures else fields.get("architecture", "unknown")
    fields["model_type"] = text.get("model_type", raw.get("model_type", fields.get("model_type", "unknown")))
    return fields
