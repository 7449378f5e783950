"""Where the shipped presets and templates live, installed or in a source checkout.

In a wheel they are packaged under `gdnctl/_data/`; in a checkout (editable install, tests) they are the
top-level `presets/` and `templates/` folders.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    installed = _PACKAGE_DIR / "_data" / name
    if installed.is_dir():
        return installed
    return _PACKAGE_DIR.parent / name


def presets_dir() -> Path:
    return data_dir("presets")


def templates_dir() -> Path:
    return data_dir("templates")
