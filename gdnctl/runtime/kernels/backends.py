"""Choose the Gated-DeltaNet kernel (FLA or FlashQLA), check it can run here, and plug it into Megatron-Core.

Three steps, in the order a trainer needs them:

1. `resolve_backend(name)` checks the runtime from facts that need no kernel import (torch and CUDA versions,
   GPU compute capability, installed package versions), then imports the kernel. Checking first matters:
   `import flash_qla` raises ValueError on an unsupported GPU, so a check after the import never speaks.
   The decision itself is `find_backend_problem(backend, facts)`, a pure function tests feed recorded facts;
   each backend's part of it is its adapter here (`PROBLEM_FINDERS`), and what the runtime needs to know
   about it besides is its entry in gdnctl/knowledge/gdn_backends.py.
2. The returned `GdnKernel` calls either kernel with one keyword signature, the one Megatron-Core uses.
3. `patch_megatron_gdn_kernel(kernel)` before the model is built, `install_kernel_on_layers(model, kernel)` after;
   `report_layer_kernels(model)` then says which kernel every GDN layer really calls.

Grouped value heads (GVA): both kernels accept q/k with fewer heads than v (v heads a multiple of q/k heads,
value head j reading q/k head j // group, the `repeat_interleave` layout). Megatron-Core 0.19 expands q/k to
the value-head count before the call, which is the group-of-one case of the same layout, so the adapter
passes heads through unchanged and is correct for both callers. It does not undo Megatron's expansion: it
cannot know that the heads are copies, and FlashQLA then simply runs with as many q/k heads as v heads.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gdnctl.errors import GdnctlError
from gdnctl.knowledge import FLA, FLASHQLA, GDN_BACKENDS, KERNEL_DISTRIBUTIONS, sm_label, stack, versions
from gdnctl.runtime.kernels.host_offsets import host_copy

# fla-core 0.6.0 wheel metadata: Requires-Dist torch>=2.7.0 (extra "cuda").
FLA_MIN_TORCH = "2.7"

# FLA runs on every CUDA GPU, so it is the way out of every other backend's limits.
_USE_FLA_INSTEAD = f"or set kernels.gdn_backend to {FLA.name}"
_FLASHQLA_TRAINING_SMS = FLASHQLA.gpus - FLASHQLA.forward_only_gpus


class GdnBackendUnavailable(GdnctlError, RuntimeError):
    """The chosen GDN kernel cannot run in this environment; the message says what is missing and the fix."""


class GdnInjectionError(GdnctlError, RuntimeError):
    """The installed Megatron-Core has no GDN kernel hook that gdnctl knows how to replace."""


# --- Runtime facts and the pure decision --------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeFacts:
    """What decides whether a GDN kernel can run, gathered without importing any kernel package."""

    torch_version: str | None  # None when torch is not installed
    cuda_version: str | None  # the CUDA torch was built for (torch.version.cuda); None for CPU or ROCm builds
    cuda_available: bool
    capability: tuple[int, int] | None  # compute capability of the current GPU
    device_name: str | None
    package_versions: Mapping[str, str | None] = field(default_factory=dict)  # distribution -> version


def gather_runtime_facts() -> RuntimeFacts:
    """Read the facts from this process: torch is imported, the kernel packages are only looked up."""
    package_versions = {name: _installed_version(name) for name in KERNEL_DISTRIBUTIONS}
    try:
        import torch
    except ImportError:
        return RuntimeFacts(None, None, False, None, None, package_versions)
    cuda_available = torch.cuda.is_available()
    return RuntimeFacts(
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        cuda_available=cuda_available,
        capability=tuple(torch.cuda.get_device_capability()) if cuda_available else None,
        device_name=torch.cuda.get_device_name() if cuda_available else None,
        package_versions=package_versions,
    )


def find_backend_problem(backend: str, facts: RuntimeFacts, *, training: bool = True) -> str | None:
    """The first reason `backend` cannot run given `facts`, as one sentence with the fix; None when it can."""
    find_problem = PROBLEM_FINDERS.get(backend)
    if find_problem is None:
        return f"Unknown GDN backend {backend!r}; set kernels.gdn_backend to one of {', '.join(GDN_BACKENDS)}."
    return find_problem(facts, training)


def _flashqla_problem(facts: RuntimeFacts, training: bool) -> str | None:
    if facts.torch_version is None:
        return (
            f"PyTorch is not installed; install torch>={stack.FLASHQLA_MIN_TORCH} built for "
            f"CUDA>={stack.FLASHQLA_MIN_CUDA} {_USE_FLA_INSTEAD}."
        )
    if not versions.at_least(facts.torch_version, stack.FLASHQLA_MIN_TORCH):
        return (
            f"FlashQLA needs torch>={stack.FLASHQLA_MIN_TORCH} but torch {facts.torch_version} is installed; "
            f"upgrade torch {_USE_FLA_INSTEAD}."
        )
    if not facts.cuda_available:
        return (
            f"FlashQLA needs a CUDA GPU but torch {facts.torch_version} sees none; run on a Hopper or "
            f"Blackwell GPU node {_USE_FLA_INSTEAD}."
        )
    if facts.cuda_version is None or not versions.at_least(facts.cuda_version, stack.FLASHQLA_MIN_CUDA):
        built_for = f"CUDA {facts.cuda_version}" if facts.cuda_version else "no CUDA"
        return (
            f"FlashQLA needs torch built for CUDA>={stack.FLASHQLA_MIN_CUDA} but torch {facts.torch_version} "
            f"is built for {built_for}; install a torch built for CUDA {stack.FLASHQLA_MIN_CUDA} or newer "
            f"{_USE_FLA_INSTEAD}."
        )
    gpu = f"{sm_label(facts.capability)} ({facts.device_name})"
    if not FLASHQLA.has_kernels_for(facts.capability):
        return (
            f"FlashQLA has no kernels for {gpu}; use a Hopper or Blackwell GPU "
            f"({_sm_list(FLASHQLA.gpus)}) {_USE_FLA_INSTEAD}."
        )
    flash_qla_version = facts.package_versions.get("flash-qla")
    if flash_qla_version is None:
        return f"flash-qla is not installed; pip install 'flash-qla>={stack.FLASHQLA_TRAINING_MIN}' {_USE_FLA_INSTEAD}."
    # SM120/SM121 got a backward in flash-qla 0.1.3 (its chunk/__init__.py imports blackwell_sm120's
    # fused_gdr_bwd); older releases raise NotImplementedError in the first backward, so refuse them up front.
    if (
        training
        and facts.capability in FLASHQLA.forward_only_gpus
        and versions.below(flash_qla_version, stack.FLASHQLA_SM120_BACKWARD)
    ):
        return (
            f"flash-qla {flash_qla_version} has only a forward kernel on {gpu}, so it cannot train; "
            f"pip install 'flash-qla>={stack.FLASHQLA_SM120_BACKWARD}', train on "
            f"{_sm_list(_FLASHQLA_TRAINING_SMS)} {_USE_FLA_INSTEAD}."
        )
    if training and not versions.at_least(flash_qla_version, stack.FLASHQLA_TRAINING_MIN):
        return (
            f"flash-qla {flash_qla_version} computes wrong dg gradients (QwenLM/FlashQLA PR #28); "
            f"pip install 'flash-qla>={stack.FLASHQLA_TRAINING_MIN}' {_USE_FLA_INSTEAD}."
        )
    tilelang_version = facts.package_versions.get("tilelang")
    if not versions.at_least(tilelang_version, stack.FLASHQLA_MIN_TILELANG):
        found = f"tilelang {tilelang_version} is installed" if tilelang_version else "tilelang is not installed"
        return (
            f"flash-qla needs tilelang>={stack.FLASHQLA_MIN_TILELANG} but {found}; "
            f"pip install 'tilelang>={stack.FLASHQLA_MIN_TILELANG}'."
        )
    return None


def _fla_problem(facts: RuntimeFacts, training: bool) -> str | None:
    # FLA has a backward wherever it runs, so training asks nothing more of it.
    if facts.torch_version is None:
        return f"PyTorch is not installed; install torch>={FLA_MIN_TORCH} with CUDA support."
    if not versions.at_least(facts.torch_version, FLA_MIN_TORCH):
        return f"FLA needs torch>={FLA_MIN_TORCH} but torch {facts.torch_version} is installed; upgrade torch."
    if not facts.cuda_available:
        return f"FLA's Triton GDN kernels need a CUDA GPU but torch {facts.torch_version} sees none; run on a GPU node."
    if facts.package_versions.get("triton") is None:
        return "FLA's GDN kernels need triton, which is not installed; pip install triton."
    if facts.package_versions.get("fla-core") is None and facts.package_versions.get("flash-linear-attention") is None:
        return "FLA is not installed; pip install flash-linear-attention."
    return None


# Each backend's adapter: why it cannot run given the facts, or None (tests/test_gdn_backends.py checks that
# every backend of gdnctl/knowledge/gdn_backends.py has one).
PROBLEM_FINDERS: Mapping[str, Callable[[RuntimeFacts, bool], str | None]] = {
    FLASHQLA.name: _flashqla_problem,
    FLA.name: _fla_problem,
}


def _sm_list(sms: Iterable[tuple[int, int]]) -> str:
    return ", ".join(sm_label(sm) for sm in sorted(sms))


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


# --- The adapter --------------------------------------------------------------------------------------------

# Every keyword option of the adapter with its default; all defaults are None or False.
_OPTION_DEFAULTS: Mapping[str, Any] = {
    "scale": None,
    "initial_state": None,
    "output_final_state": False,
    "use_qk_l2norm_in_kernel": False,
    "cu_seqlens": None,
}


class GdnKernel:
    """One chunked gated delta rule kernel behind Megatron-Core's call signature.

    Layout `[B, T, H, K]` for q/k, `[B, T, HV, V]` for v, `[B, T, HV]` for g (log space) and beta;
    varlen inputs have B == 1 and `cu_seqlens`. Returns `(o, final_state)`.
    """

    def __init__(
        self,
        name: str,
        raw_kernel: Callable,
        *,
        environment: Mapping[str, str] | None = None,
        shows_compile_progress: bool = False,
    ):
        self.name = name
        self.raw_kernel = raw_kernel
        self._environment = dict(environment or {})
        # Whether its first call at a shape can be watched kernel by kernel (runtime/kernels/compile_progress.py).
        self.shows_compile_progress = shows_compile_progress
        accepted = _accepted_keywords(raw_kernel, _OPTION_DEFAULTS)
        # FlashQLA's signature has no **kwargs, so an option it lacks must not be passed at all.
        self._unsupported_options = frozenset(_OPTION_DEFAULTS) - accepted
        # FLA builds its chunk index from a host copy of packed offsets when given one (no device synchronisation).
        self._takes_host_offsets = "cu_seqlens_cpu" in inspect.signature(raw_kernel).parameters
        # FlashQLA takes no host copy, but flash-qla 0.1.3 can attach the chunk offsets and indices it would
        # otherwise read back from the GPU (flash_qla/utils/index.py: _fallback_prepare_chunk_offsets' .item() and
        # _fallback_prepare_chunk_indices' .tolist(), a device synchronisation each per new offsets tensor) to the
        # offsets tensor itself, computed from a host copy (prepare_varlen_metadata; prepare_chunk_offsets and
        # prepare_chunk_indices use what is attached when its chunk size is theirs).
        self._attach_varlen_metadata = _flashqla_varlen_metadata() if name == FLASHQLA.name else None

    def __call__(
        self,
        q,
        k,
        v,
        g,
        beta,
        *,
        scale=None,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=None,
    ):
        for variable, value in self._environment.items():
            if os.environ.get(variable) != value:
                os.environ[variable] = value
        options = {
            "scale": scale,
            "initial_state": None if initial_state is None else initial_state.contiguous(),
            "output_final_state": output_final_state,
            "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel,
            "cu_seqlens": cu_seqlens,
        }
        if self._unsupported_options:
            options = self._drop_unsupported(options)
        host = host_copy(cu_seqlens)
        if self._takes_host_offsets and host is not None:
            options["cu_seqlens_cpu"] = host
        if (
            self._attach_varlen_metadata is not None
            and host is not None
            and not hasattr(cu_seqlens, _FLASHQLA_METADATA)
        ):
            self._attach_varlen_metadata(cu_seqlens, host)
        # Tensor.contiguous() returns the tensor itself when it already is contiguous, so this copies only
        # what a kernel would otherwise read with the wrong strides.
        return self.raw_kernel(
            q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), **options
        )

    def _drop_unsupported(self, options: dict[str, Any]) -> dict[str, Any]:
        for option in self._unsupported_options:
            value = options.pop(option)
            if not (value is None or value is False):
                raise TypeError(
                    f"The {self.name} GDN kernel has no {option} option, so {option}={value!r} "
                    f"cannot be honoured; leave it at its default or use the other backend."
                )
        return options

    def __repr__(self) -> str:
        return f"GdnKernel({self.name!r})"


_FLASHQLA_METADATA = "_flash_qla_prepared_varlen"  # the attribute prepare_varlen_metadata sets (flash-qla 0.1.3)


def _flashqla_varlen_metadata() -> Callable | None:
    try:
        index = importlib.import_module(f"{FLASHQLA.import_name}.utils.index")
    except ImportError:  # not installed here
        return None
    return getattr(index, "prepare_varlen_metadata", None)  # None: an older flash-qla reads the offsets back itself


def _accepted_keywords(function: Callable, wanted: Iterable[str]) -> frozenset[str]:
    """The names in `wanted` that `function` takes as keywords (all of them when it has **kwargs)."""
    parameters = inspect.signature(function).parameters.values()
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return frozenset(wanted)
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = {parameter.name for parameter in parameters if parameter.kind in keyword_kinds}
    return frozenset(name for name in wanted if name in names)


def resolve_backend(name: str, *, training: bool = True) -> GdnKernel:
    """Check that the `name` kernel (a kernels.gdn_backend value) can run here, import it, and wrap it in a
    GdnKernel.

    Raises GdnBackendUnavailable with one sentence (what is missing, how to fix it) instead of importing a
    package that would crash.
    """
    problem = find_backend_problem(name, gather_runtime_facts(), training=training)
    if problem is not None:
        raise GdnBackendUnavailable(problem)
    backend = GDN_BACKENDS[name]
    os.environ.update(backend.environment)
    return GdnKernel(
        name,
        _import_chunk_kernel(backend.kernel_module, name),
        environment=backend.environment,
        shows_compile_progress=backend.shows_compile_progress,
    )


def _import_chunk_kernel(module_name: str, backend: str) -> Callable:
    try:
        return importlib.import_module(module_name).chunk_gated_delta_rule
    except Exception as error:  # flash_qla raises ValueError, not ImportError, on GPUs it does not support
        first_line = (str(error).splitlines() or [""])[0]
        hint = GDN_BACKENDS[backend].install + ("" if backend == FLA.name else f" {_USE_FLA_INSTEAD}")
        raise GdnBackendUnavailable(
            f"Importing {module_name} failed ({type(error).__name__}: {first_line}); {hint}."
        ) from error


# --- Megatron-Core injection --------------------------------------------------------------------------------

KERNEL_GLOBAL = "chunk_gated_delta_rule"
_GDN_PACKAGE = "megatron.core.ssm.gated_delta_net"

# Modules whose global `chunk_gated_delta_rule` a GDN layer reads, by megatron-core minor release (read in
# the released wheels). 0.16/0.17 call the global on every forward; 0.18 binds it to `layer.gated_delta_rule`
# in __init__. 0.19 turned the module into a package: gdn.py imports the name from common.py and binds it in
# `_setup_variant_attrs`, so gdn is the binding that counts; common and the package re-export are patched too
# so that code importing the name from either sees the same kernel.
MEGATRON_KERNEL_MODULES: Mapping[tuple[int, int], tuple[str, ...]] = {
    (0, 16): (_GDN_PACKAGE,),
    (0, 17): (_GDN_PACKAGE,),
    (0, 18): (_GDN_PACKAGE,),
    (0, 19): (f"{_GDN_PACKAGE}.gdn", f"{_GDN_PACKAGE}.common", _GDN_PACKAGE),
}


def megatron_kernel_modules(megatron_version: str) -> tuple[str, ...]:
    """The modules to patch for a megatron-core version, or GdnInjectionError when gdnctl does not know it."""
    release = versions.parse(megatron_version).release
    modules = MEGATRON_KERNEL_MODULES.get((release[0], release[1] if len(release) > 1 else 0))
    if modules is None:
        known = ", ".join(f"{major}.{minor}" for major, minor in MEGATRON_KERNEL_MODULES)
        raise GdnInjectionError(
            f"megatron-core {megatron_version} is not one whose GDN kernel hook gdnctl "
            f"knows ({known}); install one of those megatron-core releases."
        )
    return modules


def installed_megatron_version() -> str:
    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        # A source checkout on PYTHONPATH has no distribution metadata, but carries its version in the package.
        return importlib.import_module("megatron.core.package_info").__version__


def patch_megatron_gdn_kernel(kernel: GdnKernel) -> list[str]:
    """Point Megatron-Core's module-level `chunk_gated_delta_rule` at `kernel`; call before building the model.

    Returns the patched names (`module.chunk_gated_delta_rule`).
    """
    patched = []
    for module_name in megatron_kernel_modules(installed_megatron_version()):
        module = importlib.import_module(module_name)
        if not hasattr(module, KERNEL_GLOBAL):
            raise GdnInjectionError(
                f"{module_name} has no {KERNEL_GLOBAL} to replace, so this megatron-core "
                f"build differs from its release; install a released megatron-core wheel."
            )
        setattr(module, KERNEL_GLOBAL, kernel)
        patched.append(f"{module_name}.{KERNEL_GLOBAL}")
    return patched


def install_kernel_on_layers(model: Any, kernel: GdnKernel) -> list[str]:
    """Set `layer.gated_delta_rule = kernel` on every GDN layer of a built model (one module or a list of
    virtual-pipeline chunks); returns the names of the layers changed.

    Layers in deterministic mode keep Megatron's torch reference kernel: FLA and FlashQLA are not
    deterministic. Layers without the attribute (megatron-core 0.16/0.17) read the patched module global.
    """
    changed = []
    for name, layer in _gdn_layers(model):
        if not hasattr(layer, "gated_delta_rule") or layer.config.deterministic_mode:
            continue
        layer.gated_delta_rule = kernel
        changed.append(name)
    return changed


def report_layer_kernels(model: Any) -> list[tuple[str, str]]:
    """(layer name, kernel name) for every GDN layer: its backend's name for a GdnKernel, otherwise the
    dotted name of the function the layer calls (for example Megatron's own FLA import or its torch kernel)."""
    return [(name, describe_kernel(_kernel_called_by(layer))) for name, layer in _gdn_layers(model)]


def describe_kernel(kernel: Any) -> str:
    if isinstance(kernel, GdnKernel):
        return kernel.name
    if kernel is None:
        return "none (Megatron-Core found no FLA at import)"
    return f"{getattr(kernel, '__module__', '?')}.{getattr(kernel, '__qualname__', type(kernel).__name__)}"


def _kernel_called_by(layer: Any) -> Any:
    if hasattr(layer, "gated_delta_rule"):
        return layer.gated_delta_rule
    # megatron-core 0.16/0.17: forward() picks the kernel from its module's globals on every call.
    module = sys.modules[type(layer).__module__]
    if layer.config.deterministic_mode:
        return module.torch_chunk_gated_delta_rule
    return getattr(module, KERNEL_GLOBAL)


def _gdn_layers(model: Any) -> Iterator[tuple[str, Any]]:
    gated_delta_net = importlib.import_module(_GDN_PACKAGE).GatedDeltaNet
    chunks = [model] if hasattr(model, "named_modules") else list(model)
    for index, chunk in enumerate(chunks):
        prefix = f"{index}." if len(chunks) > 1 else ""
        for name, module in chunk.named_modules():
            if isinstance(module, gated_delta_net):
                yield prefix + name, module
