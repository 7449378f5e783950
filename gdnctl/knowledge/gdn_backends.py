"""The GDN kernel backends a preset may choose (kernels.gdn_backend), each described once.

The schema takes its choices from here, and validate's KRN rules, explain, the job's environment, doctor, prewarm
and the runtime read what they decide about a backend from its entry rather than comparing names. What only the
runtime can decide (whether a backend can run in this environment, before importing it) is its adapter in
gdnctl/runtime/kernels/backends.py (`PROBLEM_FINDERS`). A new backend is an entry here, its name in
`GdnBackendName`, and that adapter; tests/test_gdn_backends.py checks the three agree and that no other module
spells a backend's name.

Plain data: importing this imports nothing heavy (`gdnctl validate` reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gdnctl.knowledge import stack
from gdnctl.knowledge.hardware import FLASHQLA_FORWARD_ONLY_SMS, FLASHQLA_SMS

# The kernels.gdn_backend values, in the order the schema, doctor and the bench list them. A Literal, so that
# pydantic and mypy check them; tests/test_gdn_backends.py checks it names exactly the entries of GDN_BACKENDS.
GdnBackendName = Literal["fla", "flashqla"]


@dataclass(frozen=True)
class GdnBackend:
    name: GdnBackendName
    label: str  # how sentences name it
    bench_label: str  # how doctor's bench table heads its columns ("fqla f+b" fits them)
    compiler: str  # what compiles its kernels on first use
    # The distributions that provide it (any one of them will do) and those its kernels need beside them; doctor
    # and the runtime look them up by metadata, never by importing them.
    distributions: tuple[str, ...]
    requires: tuple[str, ...]
    import_name: str  # its top-level package
    kernel_module: str  # the module whose chunk_gated_delta_rule the runtime calls
    install: str  # the command that installs it, said when its import fails
    runtime_field: str  # the preset's runtime: field giving its version, which version-dependent rules read
    # Compute capabilities it has kernels for (None: every CUDA GPU), and those of them where some releases have
    # only a forward kernel, so that training there depends on the version (stack.py says from which).
    gpus: frozenset[tuple[int, int]] | None
    forward_only_gpus: frozenset[tuple[int, int]]
    # Variables the job's environment sets and the runtime sets again before every call, and why.
    environment: Mapping[str, str]
    environment_reason: str
    cache_variable: str  # the variable of plan.kernel_cache_env naming where its compiled kernels are kept
    # True: runtime/kernels/compile_progress.py knows the kernels it compiles per shape and watches its compiler
    # name each one, so gdnctl estimates the compile up front, prints a line per kernel and sends the compiler's
    # output to the kernel cache's log (minutes per shape from a cold cache). False: its compiler says nothing to
    # watch, the first call's time is all there is, and prewarm says `cold_compile` before it starts.
    shows_compile_progress: bool
    cold_compile: str | None

    def has_kernels_for(self, sm: tuple[int, int] | None) -> bool:
        """Whether it has kernels for a GPU of compute capability `sm` (None: no GPU)."""
        return sm is not None and (self.gpus is None or sm in self.gpus)

    @property
    def explain(self) -> str:
        """What `gdnctl explain` says the backend runs."""
        pinned = " ".join(f"{variable}={value}" for variable, value in self.environment.items())
        return f"{self.label} {self.compiler} kernels" + (f", pinned with {pinned}" if pinned else "")


FLA = GdnBackend(
    name="fla",
    label="FLA",
    bench_label="fla",
    compiler="Triton",
    distributions=("fla-core", "flash-linear-attention"),
    requires=("triton",),
    import_name="fla",
    kernel_module="fla.ops.gated_delta_rule",
    install="pip install flash-linear-attention (fla-core) into this environment",
    runtime_field="fla",
    gpus=None,
    forward_only_gpus=frozenset(),
    # FLA 0.6.0 hands chunk_gated_delta_rule to FlashQLA whenever flash_qla imports and the GPU is
    # SM90/100/103/120 (fla/ops/gated_delta_rule/backends/flash_qla.py, default_enable=True). It reads this
    # variable on every call, so "fla" only means FLA's own Triton kernels while the variable is "0".
    environment={"FLA_FLASH_QLA": "0"},
    environment_reason="FLA 0.6 silently dispatches to FlashQLA when it is importable; this keeps fla meaning "
    "FLA's own Triton kernels",
    cache_variable="TRITON_CACHE_DIR",
    shows_compile_progress=False,
    # 98.5 s at the 35B-A3B proxy's shape (benchmarks/results/kernel-compile-prewarm-h100-2026-11-24.md).
    cold_compile="about 1.5-2 min per shape on an H100 from a cold cache",
)

FLASHQLA = GdnBackend(
    name="flashqla",
    label="FlashQLA",
    bench_label="fqla",
    compiler="TileLang",
    distributions=("flash-qla",),
    requires=("tilelang",),
    import_name="flash_qla",
    kernel_module="flash_qla",
    install=f"pip install 'flash-qla>={stack.FLASHQLA_TRAINING_MIN}' 'tilelang>={stack.FLASHQLA_MIN_TILELANG}'",
    runtime_field="flash_qla",
    gpus=FLASHQLA_SMS,
    forward_only_gpus=FLASHQLA_FORWARD_ONLY_SMS,
    environment={},
    environment_reason="",
    cache_variable="TILELANG_CACHE_DIR",
    shows_compile_progress=True,
    cold_compile=None,
)

GDN_BACKENDS: Mapping[str, GdnBackend] = {backend.name: backend for backend in (FLA, FLASHQLA)}
# What a preset gets when it names none: FLA runs on every CUDA GPU. doctor's bench times the others against it.
DEFAULT_GDN_BACKEND: GdnBackendName = FLA.name
# Every distribution a backend needs, each once, in table order.
KERNEL_DISTRIBUTIONS: tuple[str, ...] = tuple(
    dict.fromkeys(name for backend in GDN_BACKENDS.values() for name in (*backend.distributions, *backend.requires))
)
