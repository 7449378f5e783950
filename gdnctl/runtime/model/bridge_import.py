"""megatron-bridge with only the model bridges gdnctl builds imported.

`import megatron.bridge` runs two package imports that reach every model megatron-bridge supports:
megatron/bridge/__init__.py imports `megatron.bridge.diffusion.models` and `megatron.bridge.models`, and
megatron/bridge/models/__init__.py imports each model family's bridges and providers (megatron-bridge 0.6.2:
bailing, deepseek, ernie, gemma, glm, kimi, llama, mamba, mimo, nemotron, qwen_vl and ~40 more) so that their
`@MegatronModelBridge.register_bridge` decorators run. gdnctl builds Qwen3.5 and Qwen3-Next only, whose bridges
live in `megatron.bridge.models.qwen` (qwen35_bridge.py, qwen3_next_bridge.py), and AutoBridge finds a bridge
through that registry (models/conversion/model_bridge.py), so importing the qwen family registers all it needs.

`import_auto_bridge()` puts the two packages into `sys.modules` as lazy packages: created from their own specs,
with their real `__path__` (so every submodule imports as usual), but their `__init__` not yet run. The first
attribute their `__init__` would have defined (`from megatron.bridge.models import GPTModelProvider`, as
megatron/bridge/training/config.py does) runs it then, into the same module object, so nothing that needs the
whole package goes without it; a submodule's name does not (the import system asks the package for it before
importing it).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable

# The packages whose __init__ waits until something needs it, parent first.
LAZY_PACKAGES = ("megatron.bridge", "megatron.bridge.models")
# What gdnctl uses: the registry's Qwen bridges and AutoBridge.
NEEDED = ("megatron.bridge.models.qwen", "megatron.bridge.models.conversion.auto_bridge")

# The dunders a package's __init__ defines (megatron/bridge/__init__.py: __version__, __all__ and package_info's).
INIT_DUNDERS = frozenset(
    {"__all__", "__version__", "__package_name__", "__contact_names__", "__contact_emails__", "__homepage__"}
    | {"__repository_url__", "__download_url__"}
)

_lock = threading.RLock()
# Lazy packages whose __init__ has not run yet -> what runs it.
_waiting: dict[str, Callable[[], None]] = {}


def import_auto_bridge():
    """megatron-bridge's AutoBridge, with the Qwen3.5 and Qwen3-Next bridges registered."""
    with _lock:
        for name in LAZY_PACKAGES:
            if name not in sys.modules:
                install_lazy_package(name)
        for name in NEEDED:
            importlib.import_module(name)
    return sys.modules["megatron.bridge.models.conversion.auto_bridge"].AutoBridge


def install_lazy_package(name: str) -> types.ModuleType:
    """Put package `name` into sys.modules (and on its parent) without running its __init__ until an attribute
    that only __init__ defines is asked for. Its parent must already be imported (or lazy)."""
    parent, _, child = name.rpartition(".")
    if parent:
        importlib.import_module(parent)  # a namespace package such as megatron, or a lazy package already
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not an installed package", name=name)
    module = importlib.util.module_from_spec(spec)

    def __getattr__(attribute: str):
        # The import system asks a package for a submodule before importing it, and tools probe modules for
        # dunders such as __wrapped__: neither is a reason to run __init__.
        probe = attribute.startswith("__") and attribute not in INIT_DUNDERS
        if name not in _waiting or probe or _is_submodule(spec, attribute):
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        run_init(name)
        return getattr(module, attribute)

    module.__getattr__ = __getattr__
    _waiting[name] = lambda: spec.loader.exec_module(module)
    sys.modules[name] = module
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def run_init(name: str) -> None:
    """Run the waiting __init__ of lazy package `name`, its lazy subpackages' first: what `import name` would have
    done (megatron/bridge/__init__.py imports megatron.bridge.models for the registrations its __init__ makes, and
    with that package already in sys.modules the import statement alone would not run it)."""
    with _lock:
        for waiting in sorted(_waiting, key=len, reverse=True):
            if waiting.startswith(name + ".") or waiting == name:
                _waiting.pop(waiting)()


def _is_submodule(spec, attribute: str) -> bool:
    """Whether `attribute` names a module or package inside the package `spec` describes."""
    found = importlib.machinery.PathFinder.find_spec(f"{spec.name}.{attribute}", spec.submodule_search_locations)
    return found is not None
