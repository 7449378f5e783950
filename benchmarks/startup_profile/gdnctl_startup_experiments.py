"""Start-up experiments a launch can switch on without a change to gdnctl, to A/B an idea before it becomes code.

The folder's sitecustomize loads this module in every process of a launch (rank 0 and the others) when
GDNCTL_STARTUP_EXPERIMENT is set, with or without the profiler; experiments are separated by `;`:

    GDNCTL_STARTUP_EXPERIMENT='eager:megatron.core.transformer.moe.router:Router.some_method,...;triton_key' \\
        PYTHONPATH=benchmarks/startup_profile:$PYTHONPATH gdnctl launch ...

- `eager:MODULE:QUALNAME[,MODULE:QUALNAME...]`: these torch.compile'd functions run eagerly, the others stay
  compiled. When MODULE has been imported, Dynamo is told to skip the function's code
  (`torch._dynamo.eval_frame.skip_code`, torch 2.11-2.13), so its tracing leaves step 1 and its fused kernels leave
  every step. The profiler's table "torch.compile, by the function it compiled" says which functions cost the most
  tracing.
- `triton_key`: Triton hashes its own files into the key of every kernel cache entry once a process
  (`triton_key()`, 0.8 s of step 1 in the start-up profile); this computes it on a thread as soon as megatron.bridge
  starts importing, which takes seconds of Python while the hashing mostly waits on file reads and hashlib, both
  outside the GIL.

- `qwen_bridges`: megatron-bridge's AutoBridge with only its Qwen bridges imported. `import megatron.bridge` runs
  two package imports that reach every model megatron-bridge supports: megatron/bridge/__init__.py imports
  `megatron.bridge.diffusion.models` and `megatron.bridge.models`, whose __init__ imports each model family's
  bridges and providers (megatron-bridge 0.6.2: ~40 families) so that their `register_bridge` decorators run.
  Qwen3.5's and Qwen3-Next's bridges are in `megatron.bridge.models.qwen` (qwen35_bridge.py,
  qwen3_next_bridge.py), and AutoBridge finds a bridge through that registry (models/conversion/model_bridge.py).
  The two packages go into `sys.modules` as lazy packages: made from their own specs, with their real `__path__`
  (every submodule imports as usual), their __init__ not yet run. `megatron.bridge.AutoBridge` imports the qwen
  family and AutoBridge's module only; any other name their __init__ defines (`from megatron.bridge.models import
  GPTModelProvider`, as megatron/bridge/training/config.py does) runs it then, into the same module object.

Each experiment says what it did, or why it could not, on stderr with the prefix `startup experiment:`; a value
it cannot read stops the process before it starts (a typo would otherwise measure the baseline as the experiment).
"""

from __future__ import annotations

import copy
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Callable

VARIABLE = "GDNCTL_STARTUP_EXPERIMENT"
# The package whose import starts the Triton key's thread: the model build's seconds of pure-Python imports.
TRITON_KEY_TRIGGER = "megatron.bridge"
# The experiments named by a word alone (eager: takes a list).
NAMED = ("triton_key", "qwen_bridges")
# qwen_bridges: what serves AutoBridge without megatron-bridge's package imports.
QWEN_BRIDGES = ("megatron.bridge.models.qwen", "megatron.bridge.models.conversion.auto_bridge")
# The dunders megatron/bridge/__init__.py defines (__version__, __all__ and package_info's); other dunders are
# tools' probes (inspect.unwrap asks for __wrapped__) and leave __init__ waiting.
INIT_DUNDERS = frozenset(
    {"__all__", "__version__", "__package_name__", "__contact_names__", "__contact_emails__", "__homepage__"}
    | {"__repository_url__", "__download_url__"}
)


def _say(message: str) -> None:
    print(f"startup experiment: {message}", file=sys.stderr, flush=True)


def _run(callback, *args) -> None:
    """An experiment that fails says so and leaves the launch to run on without it."""
    try:
        callback(*args)
    except Exception as error:  # noqa: BLE001  (any failure of an experiment must not stop the trainer's import)
        _say(f"{getattr(callback, '__name__', callback)}: failed ({type(error).__name__}: {error})")


class _AfterBody(importlib.abc.Loader):
    """The loader a hooked module is given: its own loader does all the work, then `then(module)` runs."""

    def __init__(self, loader, then) -> None:
        self.loader = loader
        self.then = then

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name):  # get_source, is_package, resource readers: the module's own loader's
        return getattr(self.loader, name)


class _OnImport(importlib.abc.MetaPathFinder):
    """Runs callbacks for a module when it is first looked up (`before`) or once its body has run (`after`); finds
    nothing itself: a module with `after` callbacks gets a copy of the spec the finders after this one give, with a
    loader that runs them when the module is really executed (a lookup alone, importlib.util.find_spec, runs none)."""

    def __init__(self) -> None:
        self.before: dict[str, list] = {}
        self.after: dict[str, list] = {}

    def find_spec(self, name, path, target=None):
        for callback in self.before.pop(name, []):
            _run(callback)
        if name not in self.after:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        hooked = copy.copy(spec)
        hooked.loader = _AfterBody(spec.loader, lambda module: self._ran(name, module))
        return hooked

    def _ran(self, name: str, module) -> None:
        for callback in self.after.pop(name, []):
            _run(callback, module)


def _resolve(module, qualname: str):
    target = module
    for part in qualname.split("."):
        target = getattr(target, part)
    # torch.compile(fn) returns a wrapper that keeps the function it wraps (torch/_dynamo/eval_frame.py).
    return getattr(target, "_torchdynamo_orig_callable", target)


def run_eagerly(targets: list[tuple[str, str]], hooks: _OnImport) -> None:
    """Dynamo skips each MODULE:QUALNAME's code once MODULE has been imported (at once if it already has been)."""

    def skip(module_name: str, qualname: str, module) -> None:
        try:
            function = _resolve(module, qualname)
            from torch._dynamo.eval_frame import skip_code

            skip_code(function.__code__)
        except (AttributeError, ImportError) as error:
            _say(f"eager {module_name}:{qualname}: not done ({type(error).__name__}: {error})")
            return
        _say(f"eager {module_name}:{qualname}: Dynamo skips it, it runs eagerly")

    for module_name, qualname in targets:
        if module_name in sys.modules:
            _run(skip, module_name, qualname, sys.modules[module_name])
        else:
            hooks.after.setdefault(module_name, []).append(lambda module, m=module_name, q=qualname: skip(m, q, module))


def triton_key_on_a_thread() -> threading.Thread | None:
    """Starts computing Triton's key on a daemon thread; None where Triton has no `triton_key` to compute."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        try:
            from triton.compiler.compiler import triton_key
        except ImportError as error:
            _say(f"triton_key: not done ({error})")
            return None
    thread = threading.Thread(target=triton_key, name="triton-key", daemon=True)
    thread.start()
    _say("triton_key: hashing on a thread")
    return thread


_lock = threading.RLock()
# Lazy packages whose __init__ has not run yet -> what runs it.
_waiting: dict[str, Callable[[], None]] = {}


def install_lazy_package(name: str, served: dict[str, Callable[[], object]] | None = None) -> types.ModuleType:
    """Put package `name` into sys.modules (and on its parent) with its __init__ waiting until a name only __init__
    defines is asked for; a name in `served` is made by its function instead. Its parent must be importable."""
    parent, _, child = name.rpartition(".")
    if parent:
        importlib.import_module(parent)  # a namespace package such as megatron, or a lazy package already
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not an installed package", name=name)
    module = importlib.util.module_from_spec(spec)
    served = served or {}

    def __getattr__(attribute: str):
        if attribute in served and name in _waiting:
            value = served[attribute]()
            setattr(module, attribute, value)
            return value
        # The import system asks a package for a submodule before importing it: no reason to run __init__.
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
    done (megatron/bridge/__init__.py imports megatron.bridge.models for its registrations, which with that package
    already in sys.modules the import statement alone would not run)."""
    with _lock:
        for waiting in sorted(_waiting, key=len, reverse=True):
            if waiting.startswith(name + ".") or waiting == name:
                _waiting.pop(waiting)()


def _is_submodule(spec, attribute: str) -> bool:
    found = importlib.machinery.PathFinder.find_spec(f"{spec.name}.{attribute}", spec.submodule_search_locations)
    return found is not None


def _auto_bridge_from_the_qwen_bridges():
    for name in QWEN_BRIDGES:
        importlib.import_module(name)
    return sys.modules[QWEN_BRIDGES[-1]].AutoBridge


def qwen_bridges_only() -> None:
    """megatron.bridge and megatron.bridge.models become lazy packages; megatron.bridge.AutoBridge comes from the
    Qwen bridges alone."""
    with _lock:
        if "megatron.bridge" in sys.modules:
            _say("qwen_bridges: not done (megatron.bridge was already imported)")
            return
        install_lazy_package("megatron.bridge", served={"AutoBridge": _auto_bridge_from_the_qwen_bridges})
        install_lazy_package("megatron.bridge.models")
    _say("qwen_bridges: megatron-bridge's package imports wait; AutoBridge comes with the Qwen bridges only")


def parse(text: str) -> tuple[list[tuple[str, str]], set[str]]:
    """GDNCTL_STARTUP_EXPERIMENT's value -> the functions to run eagerly, and the other experiments named."""
    eager: list[tuple[str, str]] = []
    named: set[str] = set()
    for part in filter(None, (piece.strip() for piece in text.split(";"))):
        if part in NAMED:
            named.add(part)
        elif part.startswith("eager:"):
            for target in filter(None, part.removeprefix("eager:").split(",")):
                module_name, _, qualname = target.strip().partition(":")
                if not qualname:
                    raise ValueError(f"{VARIABLE}: {target!r} is not MODULE:QUALNAME")
                eager.append((module_name, qualname))
        else:
            raise ValueError(f"{VARIABLE}: {part!r} is none of eager:MODULE:QUALNAME[,...], {' and '.join(NAMED)}")
    return eager, named


def install(text: str) -> None:
    eager, named = parse(text)
    hooks = _OnImport()
    if "qwen_bridges" in named:
        _run(qwen_bridges_only)
    if eager:
        run_eagerly(eager, hooks)
    if "triton_key" in named:
        if TRITON_KEY_TRIGGER in sys.modules:
            _run(triton_key_on_a_thread)
        else:
            hooks.before.setdefault(TRITON_KEY_TRIGGER, []).append(triton_key_on_a_thread)
    if hooks.before or hooks.after:
        sys.meta_path.insert(0, hooks)


if os.environ.get(VARIABLE):
    install(os.environ[VARIABLE])
