"""Reading a preset: YAML with positions, `base:` inheritance, `--set` overrides, schema errors as findings.

Unreadable input (missing file, YAML syntax, a `base:` cycle, a malformed --set) raises PresetLoadError
(exit 2). A readable preset that breaks the schema yields PRE findings (exit 1) with the field path,
the file:line:column it was written at, and a did-you-mean for misspelt keys.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from gdnctl.errors import PresetLoadError
from gdnctl.resources import presets_dir
from gdnctl.schema import Preset
from gdnctl.validate.findings import Finding, Severity, register_load_code

UNKNOWN_KEY = register_load_code(
    "PRE001", "unknown-key", "A key the preset schema does not have",
    """
    What it checks: every key in the preset (and in the presets it builds on with `base:`) is a field of
    the schema (`gdnctl schema`).

    Why: a misspelt key (`micro_batchsize`) would otherwise be ignored silently and the job would run with
    the default.

    Fix: rename the key to the suggested field, or remove it.
    """,
)
INVALID_VALUE = register_load_code(
    "PRE002", "invalid-value", "A value of the wrong type or out of range, or a required field missing",
    """
    What it checks: each value has the type and range the schema gives (`gdnctl schema`), and required
    fields (`name`, `job`, `model`) are present.

    Why: the compiler can only reason about well-formed values.

    Fix: set the field to a value of the stated type.
    """,
)

SET_SOURCE = "--set"


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads `1e-5` as a float (YAML 1.2), not the string PyYAML's YAML 1.1 makes of it."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


@dataclass
class SourceMap:
    """Where each key path of the merged preset was written (file:line:column or --set)."""

    positions: dict[tuple, str] = field(default_factory=dict)

    def locate(self, path: tuple) -> str | None:
        while path:
            if path in self.positions:
                return self.positions[path]
            path = path[:-1]
        return None


@dataclass
class LoadedPreset:
    source: str
    data: dict
    preset: Preset | None
    findings: list[Finding]
    sources: SourceMap
    chain: list[str]  # the files merged, base first


def _positions(node: yaml.Node, file: str, prefix: tuple, out: dict[tuple, str]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                mark = key_node.start_mark
                raise PresetLoadError(f"{file}:{mark.line + 1}:{mark.column + 1}: key '{key}' appears twice; "
                                      "keep one of them.")
            seen.add(key)
            mark = key_node.start_mark
            out[prefix + (key,)] = f"{file}:{mark.line + 1}:{mark.column + 1}"
            _positions(value_node, file, prefix + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            mark = item.start_mark
            out[prefix + (index,)] = f"{file}:{mark.line + 1}:{mark.column + 1}"
            _positions(item, file, prefix + (index,), out)


def _read_yaml(path: Path) -> tuple[dict, dict[tuple, str]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PresetLoadError(f"{path}: no such file.") from None
    except IsADirectoryError:
        raise PresetLoadError(f"{path} is a directory, not a preset file.") from None
    except (OSError, UnicodeDecodeError) as err:
        raise PresetLoadError(f"{path} cannot be read: {err}.") from None
    try:
        loader = _Loader(text)
        try:  # one parse gives both the values and their positions
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = err.problem or err.context or "invalid YAML"
        raise PresetLoadError(f"{where}: {problem}; fix the YAML syntax there.") from None
    except yaml.YAMLError as err:
        raise PresetLoadError(f"{path}: invalid YAML ({err}).") from None
    if data is None:
        raise PresetLoadError(f"{path} is empty: a preset needs at least name, job and model.")
    if not isinstance(data, dict):
        raise PresetLoadError(f"{path}: a preset is a YAML mapping (key: value lines), "
                              f"not a {type(data).__name__}.")
    positions: dict[tuple, str] = {}
    if node is not None:
        _positions(node, str(path), (), positions)
    return data, positions


def resolve_preset_path(reference: str, relative_to: Path | None = None) -> Path:
    """A preset path, or the name of a shipped preset (with or without .yaml)."""
    candidates = []
    ref = Path(reference).expanduser()
    if relative_to is not None and not ref.is_absolute():
        candidates.append(relative_to / ref)
    candidates.append(ref)
    for name in (reference, f"{reference}.yaml"):
        candidates.append(presets_dir() / name)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return candidates[0] if relative_to is not None else ref


def deep_merge(base: dict, override: dict) -> dict:
    """Mappings merge key by key; lists and scalars in `override` replace those in `base`."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# Local paths a preset may give relative: to the preset file that sets them, or, from --set, to the current
# directory. They are made absolute here because the rendered scripts run from the run dir, not from either.
PATH_FIELDS = (("model", "path"), ("model", "tokenizer"), ("train", "data_path"), ("train", "save_dir"))


def _absolute_paths(data: dict, base: Path) -> None:
    for section, key in PATH_FIELDS:
        node = data.get(section)
        if isinstance(node, dict) and isinstance(node.get(key), str) and node[key]:
            path = Path(node[key]).expanduser()
            node[key] = str(path if path.is_absolute() else (base / path).resolve())


def _load_chain(path: Path, stack: list[Path]) -> tuple[dict, dict[tuple, str], list[str]]:
    resolved = path.resolve()
    if resolved in stack:
        cycle = " -> ".join(str(p) for p in stack + [resolved])
        raise PresetLoadError(f"base: presets form a cycle ({cycle}); remove one base: line.")
    data, positions = _read_yaml(path)
    _absolute_paths(data, path.parent)
    base_ref = data.pop("base", None)
    positions = {k: v for k, v in positions.items() if k[:1] != ("base",)}
    if base_ref is None:
        return data, positions, [str(path)]
    if not isinstance(base_ref, str) or not base_ref:
        raise PresetLoadError(f"{path}: base: must be a preset path or a shipped preset name.")
    base_path = resolve_preset_path(base_ref, relative_to=path.parent)
    if not base_path.is_file():
        raise PresetLoadError(f"{path}: base preset '{base_ref}' was found neither next to this file nor among "
                              "the shipped presets (gdnctl presets list).")
    base_data, base_positions, chain = _load_chain(base_path, stack + [resolved])
    return deep_merge(base_data, data), {**base_positions, **positions}, chain + [str(path)]


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """`a.b=c` -> (('a', 'b'), c) with c parsed as YAML (numbers, booleans, null, flow lists and maps)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise PresetLoadError(f"--set '{text}' is not of the form a.b=value (e.g. --set parallel.tp=2).")
    try:
        value = yaml.load(raw, Loader=_Loader) if raw.strip() else ""
    except yaml.YAMLError:
        raise PresetLoadError(f"--set '{text}': the value is not valid YAML; quote it.") from None
    return tuple(key.split(".")), value


def apply_overrides(data: dict, overrides: list[str], positions: dict[tuple, str]) -> dict:
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            elif not isinstance(child, dict):
                raise PresetLoadError(f"--set '{text}': {'.'.join(keys[:depth + 1])} is not a mapping, so it has "
                                      "no sub-keys.")
            node = child
        node[keys[-1]] = value
        if keys in PATH_FIELDS:
            _absolute_paths({keys[0]: node}, Path.cwd())
        positions[keys] = SET_SOURCE
    return data


def _model_class(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_class(arg)
            if found is not None:
                return found
    return None


def _fields_at(loc: tuple) -> list[str]:
    model: type[BaseModel] | None = Preset
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return []
        model = _model_class(model.model_fields[part].annotation)
    return list(model.model_fields) if model else []


def dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(preset)"


def _schema_findings(err: ValidationError, sources: SourceMap) -> list[Finding]:
    findings = []
    for item in err.errors():
        loc = tuple(p for p in item["loc"] if p not in ("function-after[_one_source(), ModelSpec]",))
        path = dotted(loc)
        location = sources.locate(loc)
        if item["type"] == "extra_forbidden":
            key = str(loc[-1])
            siblings = _fields_at(loc[:-1])
            close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.5)
            parent = dotted(loc[:-1]) if loc[:-1] else "the top level"
            message = f"'{key}' is not a key of {parent}."
            hint = (f"Did you mean '{close[0]}'?" if close else "Remove it.") + \
                   (f" Keys there: {', '.join(siblings)}." if siblings else "")
            findings.append(Finding(UNKNOWN_KEY.code, Severity.ERROR, path, message, hint, location))
            continue
        if item["type"] == "missing":
            message = f"{path} is required."
            hint = f"Add {path} to the preset (gdnctl schema shows its type)."
        else:
            reason = item["msg"].removeprefix("Value error, ")
            shown = item.get("input")
            shown = "" if isinstance(shown, (dict, list)) else f" (got {shown!r})"
            message = f"{reason[:1].upper()}{reason[1:]}{shown}."
            hint = f"Set {path} to a valid value (gdnctl schema shows its type)."
        findings.append(Finding(INVALID_VALUE.code, Severity.ERROR, path, message, hint, location))
    return findings


def load_preset(reference: str | Path, overrides: list[str] | None = None) -> LoadedPreset:
    path = resolve_preset_path(str(reference))
    data, positions, chain = _load_chain(path, [])
    data = apply_overrides(data, list(overrides or []), positions)
    sources = SourceMap(positions)
    try:
        preset = Preset.model_validate(data)
    except ValidationError as err:
        return LoadedPreset(str(path), data, None, _schema_findings(err, sources), sources, chain)
    return LoadedPreset(str(path), data, preset, [], sources, chain)
