"""`gdnctl presets cp`: a copy of a shipped preset that runs from wherever it is copied to.

A shipped preset may name its example files relative to itself (tiny-qwen3.5-rl-cpu's `../examples/toy-rl/...`,
which resolve in a checkout and in the installed package alike). Copied elsewhere, those paths would point
nowhere; so the copy names them absolute, where they are now, and says so. Only the path's text on its own line
is replaced, so the copy keeps the preset's comments and layout.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from gdnctl.validate import load_preset


def _relative_paths(raw: dict, resolved: dict, prefix: str = "") -> list[tuple[str, str, str]]:
    """(field, as written, absolute) for every string the loader made absolute (a local path given relative)."""
    found = []
    for key, value in raw.items():
        other = resolved.get(key)
        if isinstance(value, dict) and isinstance(other, dict):
            found += _relative_paths(value, other, f"{prefix}{key}.")
        elif (
            isinstance(value, str)
            and isinstance(other, str)
            and value != other
            and not value.startswith("~")
            and not Path(value).is_absolute()
        ):
            found.append((f"{prefix}{key}", value, other))
    return found


def portable_text(source: Path) -> tuple[str, list[str]]:
    """The preset's text with its relative local paths made absolute; and the fields that changed."""
    text = source.read_text()
    raw = yaml.safe_load(text) or {}
    changed = []
    for field, written, absolute in _relative_paths(raw, load_preset(source).data):
        key = re.escape(field.rsplit(".", 1)[-1])
        pattern = re.compile(rf"(\b{key}:\s*)({re.escape(written)})(?=\s*(?:[,}}#]|$))", re.MULTILINE)
        replacement = json.dumps(absolute)
        text, count = pattern.subn(lambda match: match.group(1) + replacement, text, count=1)  # noqa: B023 - used now
        if count:
            changed.append(field)
    return text, changed
