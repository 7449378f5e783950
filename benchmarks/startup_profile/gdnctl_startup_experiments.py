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

Each experiment says what it did, or why it could not, on stderr with the prefix `startup experiment:`; a value
it cannot read stops the process before it starts (a typo would otherwise measure the baseline as the experiment).
"""

from __future__ import annotations

import copy
import importlib.abc
import os
import sys
import threading

VARIABLE = "GDNCTL_STARTUP_EXPERIMENT"
# The package whose import starts the Triton key's thread: the model build's seconds of pure-Python imports.
TRITON_KEY_TRIGGER = "megatron.bridge"


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


def parse(text: str) -> tuple[list[tuple[str, str]], bool]:
    """GDNCTL_STARTUP_EXPERIMENT's value -> the functions to run eagerly, and whether to start the Triton key."""
    eager: list[tuple[str, str]] = []
    triton_key = False
    for part in filter(None, (piece.strip() for piece in text.split(";"))):
        if part == "triton_key":
            triton_key = True
        elif part.startswith("eager:"):
            for target in filter(None, part.removeprefix("eager:").split(",")):
                module_name, _, qualname = target.strip().partition(":")
                if not qualname:
                    raise ValueError(f"{VARIABLE}: {target!r} is not MODULE:QUALNAME")
                eager.append((module_name, qualname))
        else:
            raise ValueError(f"{VARIABLE}: {part!r} is neither eager:MODULE:QUALNAME[,...] nor triton_key")
    return eager, triton_key


def install(text: str) -> None:
    eager, triton_key = parse(text)
    hooks = _OnImport()
    if eager:
        run_eagerly(eager, hooks)
    if triton_key:
        if TRITON_KEY_TRIGGER in sys.modules:
            _run(triton_key_on_a_thread)
        else:
            hooks.before.setdefault(TRITON_KEY_TRIGGER, []).append(triton_key_on_a_thread)
    if hooks.before or hooks.after:
        sys.meta_path.insert(0, hooks)


if os.environ.get(VARIABLE):
    install(os.environ[VARIABLE])
