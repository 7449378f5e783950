"""Model architecture facts: the shipped catalog (catalog.yaml) or a local checkpoint's config.json."""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from gdnctl.files import UnreadableFile, read_json
from gdnctl.knowledge.model_arch import ModelArch
from gdnctl.knowledge.model_families import family_of, known_model_types

_CATALOG_FILE = Path(__file__).with_name("catalog.yaml")


class ModelNotFound(ValueError):
    """The model id is not in the catalog, or the checkpoint's config.json cannot be used. `hint`: the fix, where
    the one sentence for every case (PRE003's) would not say what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@lru_cache(maxsize=1)
def _catalog_file() -> dict:
    return yaml.safe_load(_CATALOG_FILE.read_text())


def _catalog() -> tuple[dict, dict[str, dict]]:
    data = _catalog_file()
    return data["defaults"], data["models"]


def _vision_defaults() -> dict:
    return _catalog_file()["vision"]


def is_vision_language(architecture: str) -> bool:
    """A vision-language class (`*ForConditionalGeneration`: a vision tower beside the language model)."""
    return architecture.endswith("ForConditionalGeneration")


def _catalog_vision(entry: dict) -> dict | None:
    """The vision tower of a catalog entry: the catalog's common one under the entry's own `vision:` values."""
    if not is_vision_language(entry["architecture"]):
        return None
    return {**_vision_defaults(), "out_hidden_size": entry["hidden_size"], **entry.get("vision", {})}


def catalog_ids() -> list[str]:
    return list(_catalog()[1])


def _canonical_id(model_id: str) -> str | None:
    """Match case-insensitively and with or without the `Qwen/` organisation prefix."""
    wanted = model_id.lower().removeprefix("qwen/")
    for known in catalog_ids():
        if known.lower().removeprefix("qwen/") == wanted:
            return known
    return None


def in_catalog(model_id: str) -> bool:
    return _canonical_id(model_id) is not None


def did_you_mean(model_id: str) -> str:
    """The sentence " Did you mean 'ID'?" naming the closest catalog id, or "" when none is close."""
    close = difflib.get_close_matches(model_id, catalog_ids(), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def from_catalog(model_id: str) -> ModelArch:
    canonical = _canonical_id(model_id)
    if canonical is None:
        raise ModelNotFound(
            f"'{model_id}' is not in the model catalog.{did_you_mean(model_id)} Known ids: "
            f"{', '.join(catalog_ids())}; or set model.path to a local checkpoint directory with a config.json."
        )
    defaults, models = _catalog()
    entry = {**defaults, **models[canonical]}
    return ModelArch(id=canonical, path=None, **{**entry, "vision": _catalog_vision(entry)})


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
# HF keys whose value is a real number; every other key of HF_CONFIG_KEYS holds an integer.
_FLOAT_KEYS = frozenset({"rms_norm_eps", "rope_theta", "partial_rotary_factor"})
_REQUIRED = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "linear_num_key_heads",
    "linear_num_value_heads",
)
# A config.json is a few KiB (a vision-language one with its vision config included); a file past this, a FIFO or
# a device is not one, and reading it would block or take the machine's memory.
MAX_CONFIG_BYTES = 4 * 1024**2


class _WrongType(ValueError):
    """A config.json value of a type its key never has: `num_hidden_layers: true`, `tie_word_embeddings: "no"`."""


def _typed(value: object, key: str, kind: str) -> object:
    """`value` when it is of `kind` as JSON writes it, checked strictly: a bool is no integer, a string no bool."""
    fits = {
        "an integer": isinstance(value, int) and not isinstance(value, bool),
        "a number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "true or false": isinstance(value, bool),
        "a string": isinstance(value, str),
        "an object": isinstance(value, dict),
        "a list of strings": isinstance(value, list) and all(isinstance(item, str) for item in value),
    }[kind]
    if not fits:
        raise _WrongType(f"{key} is {value!r}, not {kind}")
    return value


def _value(config: dict, key: str, kind: str, where: str = "") -> Any:
    """config[key] of `kind`, or None when absent or null. Any: the JSON type is checked at run time against
    `kind`, which a static type cannot follow."""
    value = config.get(key)
    return None if value is None else _typed(value, f"{where}{key}", kind)


def _full_attention_interval(text: dict, where: str) -> int | None:
    layer_types = _value(text, "layer_types", "a list of strings", where)
    if not layer_types:
        return _value(text, "full_attention_interval", "an integer", where)
    full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    if not full:
        return None
    return full[0] + 1


def from_checkpoint(path: str, fallback_id: str | None = None) -> ModelArch:
    """Read `<path>/config.json`; fields it lacks come from the catalog entry of `fallback_id`."""
    config_file = Path(path).expanduser() / "config.json"
    try:
        raw = read_json(config_file, MAX_CONFIG_BYTES)
    except UnreadableFile as err:
        if not config_file.exists():
            raise ModelNotFound(
                f"{config_file} does not exist: model.path must be a checkpoint directory with a config.json"
            ) from None
        raise ModelNotFound(f"{err}: model.path must be a checkpoint directory with its config.json.") from None
    if not isinstance(raw, dict):
        raise ModelNotFound(f"{config_file} is not a JSON object.")
    base = from_catalog(fallback_id).model_dump() if fallback_id is not None else dict(_catalog()[0])
    try:
        fields = _fields_of(raw, base)
    except _WrongType as err:
        raise ModelNotFound(f"{config_file} has values gdnctl cannot use: {err}.") from None
    except (ValueError, ArithmeticError) as err:
        # a hand-edited or hostile config.json (a count of 0): a sentence, no trace
        raise ModelNotFound(f"{config_file} has values gdnctl cannot use ({type(err).__name__}: {err}).") from None
    if family_of(fields["model_type"]) is None:
        raise ModelNotFound(
            f"{config_file} names model_type {fields['model_type']!r}, which is not a Gated DeltaNet family gdnctl "
            f"runs ({known_model_types()}): model.path must be a Qwen3.5 or Qwen3-Next checkpoint."
        )
    missing = [name for name in _REQUIRED if fields.get(name) is None]
    if missing:
        raise ModelNotFound(
            f"{config_file} lacks {', '.join(missing)}: is this a Qwen3.5 or Qwen3-Next (Gated DeltaNet) checkpoint?"
        )
    fields["path"] = str(path)
    fields["id"] = fallback_id and _canonical_id(fallback_id)
    try:
        fields["vision"] = _checkpoint_vision(raw, fields, Path(path).expanduser())
    except _WrongType as err:
        raise ModelNotFound(
            f"{config_file} or its preprocessor_config.json has values gdnctl cannot use: {err}."
        ) from None
    try:
        return ModelArch(**fields)
    except ValueError as err:
        raise ModelNotFound(f"{config_file} has values gdnctl cannot use: {err}") from None


# config.json's vision_config keys that VisionArch keeps (the same names), and the token ids at its top level.
VISION_CONFIG_KEYS = (
    "depth",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "patch_size",
    "temporal_patch_size",
    "spatial_merge_size",
    "out_hidden_size",
    "num_position_embeddings",
    "in_channels",
)
VISION_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
PREPROCESSOR_FILE = "preprocessor_config.json"
MAX_PREPROCESSOR_BYTES = 1024**2


def _checkpoint_vision(raw: dict, fields: dict, directory: Path) -> dict | None:
    """The vision tower of a vision-language checkpoint: its config.json's vision_config and token ids and its
    preprocessor_config.json's pixel bounds and normalisation, over the catalog's (the fallback entry's, else the
    common one). None for a text-only class."""
    if not is_vision_language(fields["architecture"]):
        return None
    vision = dict(fields.get("vision") or {**_vision_defaults(), "out_hidden_size": fields["hidden_size"]})
    tower = _value(raw, "vision_config", "an object") or {}
    for key in VISION_CONFIG_KEYS:
        value = _value(tower, key, "an integer", "vision_config.")
        if value is not None:
            vision[key] = value
    for key in VISION_TOKEN_KEYS:
        value = _value(raw, key, "an integer")
        if value is not None:
            vision[key] = value
    preprocessor = directory / PREPROCESSOR_FILE
    if preprocessor.exists():
        try:
            processing = read_json(preprocessor, MAX_PREPROCESSOR_BYTES)
        except UnreadableFile as err:
            raise _WrongType(str(err)) from None
        if not isinstance(processing, dict):
            raise _WrongType(f"{preprocessor} is not a JSON object")
        size = _value(processing, "size", "an object") or {}
        # transformers 5 writes the bounds as size.shortest_edge / longest_edge (pixel counts); Qwen2-VL's older
        # files as min_pixels / max_pixels.
        for key, names in (
            ("min_pixels", ("shortest_edge", "min_pixels")),
            ("max_pixels", ("longest_edge", "max_pixels")),
        ):
            for name in names:
                value = _value(size, name, "an integer", "size.") or _value(processing, name, "an integer")
                if value is not None:
                    vision[key] = value
                    break
        for key in ("patch_size", "temporal_patch_size"):
            value = _value(processing, key, "an integer")
            if value is not None:
                vision[key] = value
        merge = _value(processing, "merge_size", "an integer")
        if merge is not None:
            vision["spatial_merge_size"] = merge
        for key in ("image_mean", "image_std"):
            value = processing.get(key)
            if value is not None:
                if not (isinstance(value, list) and len(value) == 3 and all(_is_number(v) for v in value)):
                    raise _WrongType(f"{key} is {value!r}, not three numbers")
                vision[key] = tuple(value)
    return vision


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fields_of(raw: dict, base: dict) -> dict:
    """ModelArch's fields from a config.json (its text_config when nested) over `base` (catalog values). Every
    value is taken as its key's JSON type or refused (_WrongType): pydantic's coercion would read `"no"` as
    true and `true` as one layer."""
    nested = _value(raw, "text_config", "an object")
    text, where = (nested, "text_config.") if nested is not None else (raw, "")
    fields = dict(base)
    for hf_key, field in HF_CONFIG_KEYS.items():
        value = _value(text, hf_key, "a number" if hf_key in _FLOAT_KEYS else "an integer", where)
        if value is not None:
            fields[field] = value
    rope = _value(text, "rope_parameters", "an object", where)
    for key in ROPE_KEYS if rope is not None else ():
        value = _value(rope, key, "a number", f"{where}rope_parameters.")
        if value is not None:
            fields[key] = value
    interval = _full_attention_interval(text, where)
    if interval:
        fields["full_attention_interval"] = interval
    if "head_dim" not in text and text.get("hidden_size") and text.get("num_attention_heads"):
        fields.setdefault("head_dim", text["hidden_size"] // text["num_attention_heads"])
    tie = _value(raw, "tie_word_embeddings", "true or false")
    if tie is None:
        tie = _value(text, "tie_word_embeddings", "true or false", where)
    if tie is not None:
        fields["tie_word_embeddings"] = tie
    fields.setdefault("tie_word_embeddings", False)
    architectures = _value(raw, "architectures", "a list of strings") or []
    fields["architecture"] = architectures[0] if architectures else fields.get("architecture", "unknown")
    model_type = _value(text, "model_type", "a string", where) or _value(raw, "model_type", "a string")
    fields["model_type"] = model_type or fields.get("model_type", "unknown")
    return fields
