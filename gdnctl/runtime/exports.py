"""Lazy public names for the runtime's subpackages.

Each runtime subpackage names its public API in `__all__`, but most of it imports torch (and Megatron, vLLM)
at module level. A caller that needs one light name (doctor reads `RuntimeFacts` on a machine without torch)
must not pay for, or fail on, the rest; so a subpackage's `__init__` maps each name to the module that defines
it and imports that module on first access (PEP 562).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_attributes(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `package` that imports `package.homes[name]` when `name` is first used."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{homes[name]}"), name)

    return __getattr__
