"""Communication memory guard: check free GPU memory before collectives, with a configurable skip set.

Modelled on slime's `slime/utils/reloadable_process_group.py`. `install(policy)` replaces the
`torch.distributed` functions named in `gdnctl/schema/comm_ops.py` DIST_FUNCTIONS with wrappers, wraps the
groups `dist.new_group` returns (and `dist.group.WORLD`) so their PROCESS_GROUP_METHODS go through the same
guard, and makes `dist.P2POp` accept the wrapped `isend`/`irecv`. Before a checked call the guard reads
driver-visible free memory and, below `free_gb_threshold`, synchronizes, collects garbage and empties the
allocator cache. An op in `skip_ops` is forwarded without reading memory: the read alone costs ~10 us on an
H100, which is what made the per-call check a 5x MFU regression (slime issue #1717).

Only the `torch.distributed` package attributes are replaced, never `distributed_c10d`'s: torch's own
helpers (e.g. `all_gather_object` calling `all_gather`) keep calling the originals, so one public call is
one check. A module that bound a function at import (`from torch.distributed import _coalescing_manager`,
`dist_reduce_scatter_func = torch.distributed.reduce_scatter_tensor`) keeps the object it bound, so
replacing the package attribute does not reach it: install also rebinds the names of MEGATRON_BINDINGS in
the modules already imported, and uninstall puts the originals back, so Megatron's collectives are guarded
whether the guard is installed before or after `import megatron.core`. Other code that binds a function at
import must be imported after install. Groups created while the guard is installed are only valid while it
is: the original functions do not know the wrapper.
"""

from __future__ import annotations

import difflib
import functools
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from gdnctl.errors import GdnctlError
from gdnctl.schema import PROFILE_FILE_PATTERN, PROFILE_FORMAT, PROFILE_VERSION, comm_ops

GIB = 1024**3

# Functions that take a group but do not communicate: like the query functions they must see the real
# group. Megatron's distributed optimizer passes its data-parallel group to `_coalescing_manager`, and a
# collective inside the manager only queues itself when its (unwrapped) group is the one the manager was given.
# The queued call is the one the guard counts and checks; torch issues the coalesced collective at the manager's
# exit on the real group, past the guard, so the profile has no `*_coalesced` count (or memory drop) for it.
_GROUP_ARGUMENT_FUNCTIONS = ("_coalescing_manager", "destroy_process_group")
_PROCESS_GROUP_METHOD_NAMES = frozenset(comm_ops.PROCESS_GROUP_METHODS)

# The names megatron-core binds from torch.distributed when a module is imported, per module: each is rebound to
# the guard's wrapper of the object it holds. Surveyed in megatron-core 0.19.2, megatron/core/<file>:<line of the
# binding>, then where a training step calls it; 0.16.1 binds the same names in the same modules. A module not
# imported, a name it lacks, or a value that is not a wrapped function (torch < 1.13's `_all_gather_base`, or
# the `reduce_scatter_with_fp32_accumulation` that param_and_grad_buffer.py:249 assigns when
# ddp_config.reduce_scatter_with_fp32_accumulation is on) is left alone. transformer/multi_token_prediction.py:48
# binds dist_all_gather_func and never calls it. Every other collective under megatron/core (parallel_state, the
# distributed optimizer, finalize_model_grads, clip_grads, the MoE token dispatchers and router, pipeline P2POps)
# is looked up as `torch.distributed.<name>` when called, which the package attribute covers.
MEGATRON_BINDINGS: dict[str, tuple[str, ...]] = {
    # distributed/param_and_grad_buffer.py:15 `from torch.distributed import _coalescing_manager` and :50-51:
    # the gradient reduce-scatter (:712) and the parameter all-gather (:515) of the distributed optimizer, each
    # inside a _coalescing_manager (:702, :504).
    "megatron.core.distributed.param_and_grad_buffer": (
        "_coalescing_manager",
        "dist_all_gather_func",
        "dist_reduce_scatter_func",
    ),
    # distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py:33: Megatron-FSDP's coalesced bucket
    # collectives (:4038, :4132, :4542, :4561).
    "megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer": ("_coalescing_manager",),
    # tensor_parallel/mappings.py:12-13: the sequence-parallel gathers (:96 _gather_along_last_dim, :146
    # _gather_along_first_dim) and reduce-scatter (:186 _reduce_scatter_along_first_dim).
    "megatron.core.tensor_parallel.mappings": ("dist_all_gather_func", "dist_reduce_scatter_func"),
    # tensor_parallel/layers.py:85-86: the sequence-parallel linear layer's input all-gather (forward :571,
    # backward :617) and its input-gradient reduce-scatter (:650).
    "megatron.core.tensor_parallel.layers": ("dist_all_gather_func", "dist_reduce_scatter_func"),
    # tensor_parallel/utils.py:15: gather_split_1d_tensor (:93).
    "megatron.core.tensor_parallel.utils": ("dist_all_gather_func",),
    # utils.py:1227: drain_embedding_wgrad_compute's all-gathers (:1260, :1298).
    "megatron.core.utils": ("dist_all_gather_func",),
    # timers.py:26: Timers gathering every rank's times (:314).
    "megatron.core.timers": ("dist_all_gather_func",),
}


class CommPolicyError(GdnctlError, ValueError):
    """The comm section of the engine config names something the guard cannot honour."""


@dataclass(frozen=True)
class CommGuardPolicy:
    """What the guard checks: the free-memory threshold, the ops it never checks, and whether it profiles."""

    free_gb_threshold: float
    skip_ops: frozenset[str]
    profile: bool
    profile_dir: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "skip_ops", frozenset(self.skip_ops))
        unknown = sorted(self.skip_ops - comm_ops.ALL_OPS)
        if unknown:
            suggestions = [
                match for name in unknown for match in difflib.get_close_matches(name, sorted(comm_ops.ALL_OPS), n=1)
            ]
            hint = f" (did you mean {', '.join(suggestions)}?)" if suggestions else ""
            raise CommPolicyError(
                f"comm.skip_ops names unknown ops {', '.join(unknown)}{hint}; use torch.distributed collective "
                f"or ProcessGroup method names, which `gdnctl rules COM001` lists."
            )
        if not self.free_gb_threshold >= 0:
            raise CommPolicyError(
                f"comm.free_gb_threshold is {self.free_gb_threshold}; set it to a number of "
                "GiB at or above 0 (slime uses 3)."
            )
        if self.profile and self.profile_dir is None:
            raise CommPolicyError(
                "comm.profile is on but the engine config names no profile directory; "
                "render the run dir again with `gdnctl render`."
            )

    @classmethod
    def from_engine(cls, comm: Any, base_dir: str | Path | None = None) -> CommGuardPolicy:
        """Build the policy from the engine config's `comm` section; a relative profile_dir is taken from
        `base_dir` (the run dir holding engine.yaml, where `gdnctl comm-report` looks for it)."""
        profile_dir = Path(comm.profile_dir)
        if base_dir is not None and not profile_dir.is_absolute():
            profile_dir = Path(base_dir) / profile_dir
        return cls(
            free_gb_threshold=comm.free_gb_threshold,
            skip_ops=frozenset(comm.skip_ops),
            profile=comm.profile,
            profile_dir=profile_dir,
        )


# --- memory probes ------------------------------------------------------------------------------------------


class MemoryProbe(Protocol):
    """Where the guard reads free memory, and how it gives cached memory back."""

    name: str

    def free_and_total_bytes(self) -> tuple[int, int]: ...

    def allocator_bytes(self) -> tuple[int, int]:
        """PyTorch caching allocator (allocated, reserved) bytes."""
        ...

    def synchronize(self) -> None: ...

    def empty_cache(self) -> None: ...

    def capturing(self) -> bool:
        """Whether the current stream is recording a CUDA graph (nothing runs then, and nothing may wait)."""
        ...


class CudaMemoryProbe:
    """The current CUDA device, as the driver and PyTorch's caching allocator see it."""

    name = "cuda"

    def free_and_total_bytes(self) -> tuple[int, int]:
        return torch.cuda.mem_get_info()

    def allocator_bytes(self) -> tuple[int, int]:
        return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()


class HostMemoryProbe:
    """Host memory, so CPU (gloo) runs take the same guard path as GPU runs."""

    name = "host"

    def free_and_total_bytes(self) -> tuple[int, int]:
        fields = {}
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) * 1024
        return fields["MemAvailable"], fields["MemTotal"]

    def allocator_bytes(self) -> tuple[int, int]:
        # PyTorch's CPU allocator keeps no cache, so there is nothing like allocated vs reserved to report.
        return 0, 0

    def synchronize(self) -> None:
        """CPU collectives are complete when they return."""

    def empty_cache(self) -> None:
        """The CPU allocator holds no cache to give back."""

    def capturing(self) -> bool:
        return False


class CountingProbe:
    """Forwards to another probe and counts memory reads and cache releases (selftest and tests)."""

    def __init__(self, inner: MemoryProbe):
        self.inner = inner
        self.name = inner.name
        self.reads = 0
        self.releases = 0

    def free_and_total_bytes(self) -> tuple[int, int]:
        self.reads += 1
        return self.inner.free_and_total_bytes()

    def allocator_bytes(self) -> tuple[int, int]:
        return self.inner.allocator_bytes()

    def synchronize(self) -> None:
        self.inner.synchronize()

    def empty_cache(self) -> None:
        self.releases += 1
        self.inner.empty_cache()

    def capturing(self) -> bool:
        return self.inner.capturing()


def default_memory_probe() -> MemoryProbe:
    """The CUDA probe once this process has initialised CUDA, else the host probe."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return CudaMemoryProbe()
    return HostMemoryProbe()


# --- profiling ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallMemory:
    """How one call moved memory: a positive driver drop means the call left less free memory."""

    driver_drop_bytes: int
    allocated_delta_bytes: int
    reserved_delta_bytes: int

    def field_max(self, other: CallMemory) -> CallMemory:
        return CallMemory(
            max(self.driver_drop_bytes, other.driver_drop_bytes),
            max(self.allocated_delta_bytes, other.allocated_delta_bytes),
            max(self.reserved_delta_bytes, other.reserved_delta_bytes),
        )


@dataclass
class OpProfile:
    calls: int = 0
    checks: int = 0
    clears: int = 0
    guard_seconds: float = 0.0
    groups: int = 0  # distinct process groups the op ran on
    # A group's first collective sets up its communicator and buffers (NCCL does it lazily: ~0.4 GiB per group
    # on an H200, ~3.7 GiB at a first all_to_all in slime PR #1947). That is not what a per-call check protects
    # against, so every group's first use is kept apart from steady state: per group, not per op, or the first
    # call on the run's second group would read as a steady-state footprint.
    first_use_max: CallMemory | None = None
    steady_state_max: CallMemory | None = None

    def record(
        self, checked: bool, cleared: bool, guard_seconds: float, memory: CallMemory, first_on_group: bool
    ) -> None:
        self.calls += 1
        self.checks += checked
        self.clears += cleared
        self.guard_seconds += guard_seconds
        if first_on_group:
            self.groups += 1
            self.first_use_max = memory if self.first_use_max is None else self.first_use_max.field_max(memory)
        elif self.steady_state_max is None:
            self.steady_state_max = memory
        else:
            self.steady_state_max = self.steady_state_max.field_max(memory)


def _group_of(original: Callable, args: tuple, kwargs: dict) -> dist.ProcessGroup | None:
    """The group a call runs on: a group argument, else the group whose method it is; None: the default group."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, dist.ProcessGroup):
            return value
    owner = getattr(original, "__self__", None)
    return owner if isinstance(owner, dist.ProcessGroup) else None


# --- the guard ----------------------------------------------------------------------------------------------


class _Guard:
    def __init__(self, policy: CommGuardPolicy, probe: MemoryProbe):
        self.policy = policy
        self.probe = probe
        self.threshold_bytes = policy.free_gb_threshold * GIB
        self.op_profiles: dict[str, OpProfile] | None = {} if policy.profile else None
        self._used_groups: set[tuple[str, int]] = set()  # (op, id(group)) seen, while profiling

    def call(self, op: str, original: Callable, args: tuple, kwargs: dict) -> Any:
        if self.probe.capturing():
            # A collective inside a CUDA-graph capture (the MoE router's aux-loss all-reduce with speed.cuda_graphs)
            # is recorded, not run, and its replays never come back through Python: there is nothing to check, and
            # the check's synchronize and empty_cache would break the capture.
            return original(*args, **kwargs)
        if self.op_profiles is not None:
            return self._call_profiled(op, original, args, kwargs)
        if op not in self.policy.skip_ops:
            self._check()
        try:
            return original(*args, **kwargs)
        except Exception as error:
            error.add_note(self.memory_note(op))
            raise

    def _check(self) -> bool:
        free_bytes, _ = self.probe.free_and_total_bytes()
        if free_bytes >= self.threshold_bytes:
            return False
        self.probe.synchronize()
        gc.collect()
        self.probe.empty_cache()
        return True

    def _call_profiled(self, op: str, original: Callable, args: tuple, kwargs: dict) -> Any:
        checked = op not in self.policy.skip_ops
        cleared, guard_seconds = False, 0.0
        if checked:
            started = time.perf_counter()
            cleared = self._check()
            guard_seconds = time.perf_counter() - started
        # Measured after any clear so the drop is the call's own; skipped ops are measured too, because
        # deciding whether an op may be skipped is what the profile is for.
        free_before, _ = self.probe.free_and_total_bytes()
        allocated_before, reserved_before = self.probe.allocator_bytes()
        try:
            result = original(*args, **kwargs)
        except Exception as error:
            error.add_note(self.memory_note(op))
            raise
        free_after, _ = self.probe.free_and_total_bytes()
        allocated_after, reserved_after = self.probe.allocator_bytes()
        memory = CallMemory(
            free_before - free_after, allocated_after - allocated_before, reserved_after - reserved_before
        )
        use = (op, id(_group_of(original, args, kwargs)))
        first_on_group = use not in self._used_groups
        self._used_groups.add(use)
        self.op_profiles.setdefault(op, OpProfile()).record(checked, cleared, guard_seconds, memory, first_on_group)
        return result

    def memory_note(self, op: str) -> str:
        where = f"gdnctl comm guard: {op} failed on rank {_current_rank()}"
        try:
            free_bytes, total_bytes = self.probe.free_and_total_bytes()
            allocated, reserved = self.probe.allocator_bytes()
        except Exception as error:  # the note must never hide the collective's own error
            return f"{where}; memory state unavailable ({type(error).__name__}: {error})."
        return (
            f"{where}; {self.probe.name} free memory {free_bytes / GIB:.2f} of {total_bytes / GIB:.2f} GiB, "
            f"torch allocator {allocated / GIB:.2f} GiB allocated, {reserved / GIB:.2f} GiB reserved."
        )

    def profile_document(self) -> dict:
        return {
            "format": PROFILE_FORMAT,
            "version": PROFILE_VERSION,
            "rank": _current_rank(),
            "world_size": distributed_c10d.get_world_size() if distributed_c10d.is_initialized() else 1,
            "probe": self.probe.name,
            "free_gb_threshold": self.policy.free_gb_threshold,
            "skip_ops": sorted(self.policy.skip_ops),
            "ops": {op: asdict(profile) for op, profile in sorted((self.op_profiles or {}).items())},
        }


def _current_rank() -> int:
    if distributed_c10d.is_initialized():
        return distributed_c10d.get_rank()
    return int(os.environ.get("RANK", "0"))


# --- wrapped objects ----------------------------------------------------------------------------------------


class GuardedProcessGroup(dist.ProcessGroup):
    """A process group whose communication methods go through the guard; everything else is the inner group's.

    It subclasses ProcessGroup so `isinstance` checks in callers still pass; the guarded functions hand the
    inner group to torch, so torch never sees the wrapper.
    """

    def __init__(self, inner: dist.ProcessGroup):
        super().__init__(inner.rank(), inner.size())
        object.__setattr__(self, "_guarded_inner", inner)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__"):
            return object.__getattribute__(self, name)
        inner = object.__getattribute__(self, "_guarded_inner")
        if name == "_guarded_inner":
            return inner
        attribute = getattr(inner, name)
        if name in _PROCESS_GROUP_METHOD_NAMES:
            return _guarded_method(name, attribute)
        return attribute

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_guarded_inner"), name, value)

    def __repr__(self) -> str:
        return f"GuardedProcessGroup({object.__getattribute__(self, '_guarded_inner')!r})"


def _inner_group(value: Any) -> Any:
    return object.__getattribute__(value, "_guarded_inner") if type(value) is GuardedProcessGroup else value


def _unwrap_groups(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return (tuple(_inner_group(arg) for arg in args), {key: _inner_group(value) for key, value in kwargs.items()})


def _guard_group(group: Any) -> Any:
    # new_group returns a non-ProcessGroup sentinel on ranks outside the group; that stays as it is.
    if isinstance(group, dist.ProcessGroup) and type(group) is not GuardedProcessGroup:
        return GuardedProcessGroup(group)
    return group


def _guarded_function(op: str, original: Callable) -> Callable:
    @functools.wraps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _unwrap_groups(args, kwargs)
        if _installation is None:
            return original(*args, **kwargs)
        return _installation.guard.call(op, original, args, kwargs)

    return guarded


def _guarded_method(op: str, method: Callable) -> Callable:
    # Built on every attribute access, so kept lighter than the function wrappers (no functools.wraps).
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _installation is None:
            return method(*args, **kwargs)
        return _installation.guard.call(op, method, args, kwargs)

    return guarded


def _unwrapping_callable(original: Callable) -> Callable:
    @functools.wraps(original)
    def unwrapping(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _unwrap_groups(args, kwargs)
        return original(*args, **kwargs)

    return unwrapping


def _group_guarding_callable(original: Callable) -> Callable:
    @functools.wraps(original)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        return _guard_group(original(*args, **kwargs))

    return new_group


class _GuardedWorldMeta(type):
    @property
    def WORLD(cls) -> Any:  # noqa: N802 - torch's name
        return _installation.guarded_world() if _installation is not None else distributed_c10d.group.WORLD


class _GuardedGroupNamespace(metaclass=_GuardedWorldMeta):
    """Stands in for `torch.distributed.group` so `dist.group.WORLD.allreduce(...)` is guarded too."""


# --- install / uninstall ------------------------------------------------------------------------------------


@dataclass
class _Installation:
    guard: _Guard
    replaced: dict[str, Any] = field(default_factory=dict)  # torch.distributed attribute -> original
    replaced_p2p: dict[str, Any] = field(default_factory=dict)  # P2POp.__dict__ entry -> original
    original_by_wrapper_id: dict[int, Callable] = field(default_factory=dict)
    wrapper_by_original_id: dict[int, Any] = field(default_factory=dict)
    world: tuple[Any, GuardedProcessGroup] | None = None

    def replace(self, name: str, wrapper: Any) -> None:
        original = getattr(dist, name)
        self.replaced[name] = original
        self.original_by_wrapper_id[id(wrapper)] = original
        self.wrapper_by_original_id[id(original)] = wrapper
        setattr(dist, name, wrapper)

    def guarded_world(self) -> Any:
        world = distributed_c10d.group.WORLD
        if world is None:
            return None
        if self.world is None or self.world[0] is not world:
            self.world = (world, GuardedProcessGroup(world))
        return self.world[1]

    def p2p_argument(self, value: Any) -> Any:
        """P2POp checks `op in (isend, irecv)` against the originals and looks its group up by identity."""
        return self.original_by_wrapper_id.get(id(value), _inner_group(value))


_installation: _Installation | None = None


def install(policy: CommGuardPolicy, probe: MemoryProbe | None = None) -> None:
    """Put the guard in front of torch.distributed communication for this process."""
    global _installation
    if _installation is not None:
        raise RuntimeError("The comm guard is already installed; call uninstall() before installing it again.")
    installation = _Installation(_Guard(policy, probe or default_memory_probe()))
    for name in comm_ops.DIST_FUNCTIONS:
        if hasattr(dist, name):
            installation.replace(name, _guarded_function(name, getattr(dist, name)))
    for name in (*comm_ops.QUERY_FUNCTIONS, *_GROUP_ARGUMENT_FUNCTIONS):
        if hasattr(dist, name):
            installation.replace(name, _unwrapping_callable(getattr(dist, name)))
    installation.replace("new_group", _group_guarding_callable(dist.new_group))
    installation.replace("group", _GuardedGroupNamespace)
    _patch_p2p_op(installation)
    _rebind_imported(installation.wrapper_by_original_id)
    _installation = installation


def _rebind_imported(replacements: dict[int, Any]) -> None:
    """Rebind each MEGATRON_BINDINGS name of an imported module whose value is a key of `replacements` (by id).

    By identity rather than by name: the object a name holds depends on the torch and Megatron versions and on
    Megatron's own reassignments, and only an object the guard wrapped has a counterpart to swap in.
    """
    for module_name, names in MEGATRON_BINDINGS.items():
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name in names:
            replacement = replacements.get(id(getattr(module, name, None)))
            if replacement is not None:
                setattr(module, name, replacement)


def _patch_p2p_op(installation: _Installation) -> None:
    original_new = dist.P2POp.__dict__["__new__"]
    original_init = dist.P2POp.__dict__["__init__"]
    installation.replaced_p2p.update(__new__=original_new, __init__=original_init)
    convert = installation.p2p_argument

    def p2p_new(cls: type, *args: Any, **kwargs: Any) -> Any:
        return original_new.__func__(cls, *map(convert, args), **{k: convert(v) for k, v in kwargs.items()})

    def p2p_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *map(convert, args), **{k: convert(v) for k, v in kwargs.items()})

    dist.P2POp.__new__ = staticmethod(p2p_new)
    dist.P2POp.__init__ = p2p_init


def uninstall() -> None:
    """Write the profile (when profiling) and restore every replaced object; a no-op when not installed."""
    global _installation
    installation = _installation
    if installation is None:
        return
    try:
        if installation.guard.op_profiles is not None:
            write_profile()
    finally:
        for name, original in installation.replaced.items():
            setattr(dist, name, original)
        for name, original in installation.replaced_p2p.items():
            setattr(dist.P2POp, name, original)
        # Also reaches the modules imported while the guard was installed, which bound the wrappers themselves.
        _rebind_imported(installation.original_by_wrapper_id)
        _installation = None


def set_policy(policy: CommGuardPolicy) -> None:
    """Change what the installed guard checks, keeping its wrappers, groups and memory probe.

    For comparing policies step by step inside one process (benchmarks/trainer_throughput.py interleaved):
    uninstalling mid-run is not an option, because groups created while the guard is installed are only valid
    while it is. Refused while either policy profiles: a profile must describe one policy.
    """
    if _installation is None:
        raise RuntimeError("The comm guard is not installed; install(policy) first.")
    if policy.profile or _installation.guard.op_profiles is not None:
        raise RuntimeError("set_policy cannot swap a profiling policy; profile one policy per run.")
    _installation.guard = _Guard(policy, _installation.guard.probe)


def is_installed() -> bool:
    return _installation is not None


def write_profile(directory: str | Path | None = None) -> Path:
    """Write this rank's per-op profile as `comm_profile_rank{R}.json` (into the policy's profile_dir by
    default) and return its path."""
    if _installation is None or _installation.guard.op_profiles is None:
        raise RuntimeError("No comm profile to write: install the guard with a policy that has profile=True.")
    document = _installation.guard.profile_document()
    target_dir = Path(directory) if directory is not None else _installation.guard.policy.profile_dir
    target_dir.mkdir(parents=True, exist_ok=True)
    path = target_dir / PROFILE_FILE_PATTERN.format(rank=document["rank"])
    # Written whole then renamed, so a reader never sees half a file.
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    partial.replace(path)
    return path
