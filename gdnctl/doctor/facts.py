"""What the doctor knows about a machine: plain data, saved and loaded as JSON so checks can be replayed."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Distributions the doctor looks up (by metadata, without importing them).
PACKAGES = ("torch", "triton", "flash-qla", "tilelang", "fla-core", "flash-linear-attention", "megatron-core",
            "megatron-bridge", "transformer-engine", "transformer_engine", "vllm", "nvidia-cudnn-cu12",
            "nvidia-cudnn-cu13", "transformers")
# Environment variables the env lint reads; the only ones facts record (cli.py's doctor help lists them too).
ENV_NAMES = ("CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF", "FLA_FLASH_QLA", "FLA_DISABLE_BACKEND_DISPATCH",
             "TILELANG_CACHE_DIR", "CUDA_VISIBLE_DEVICES")
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")
# Facts are shared and pasted into issues, so a variable whose name looks like a credential keeps its name (the
# env lint still sees that it is set) and loses its value: a prefix such as NCCL_ matches whatever a site or a
# plugin chose to call its variables.
CREDENTIAL_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
REDACTED = "<redacted>"


def looks_like_credential(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in CREDENTIAL_MARKERS)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {name: REDACTED if looks_like_credential(name) else value for name, value in env.items()}


@dataclass(frozen=True)
class GpuFact:
    name: str
    sm: tuple[int, int]
    memory_gib: float


@dataclass(frozen=True)
class RolloutEnvFact:
    """The rollout's own environment (rollout.python), asked in a child process."""

    python: str
    vllm: str | None  # vLLM's version there; None when it cannot be imported
    error: str | None = None  # why not: the interpreter is missing, or the last line of the import error


@dataclass(frozen=True)
class KernelCacheFact:
    path: str
    exists: bool
    writable: bool
    entries: int  # compiled kernels found (files under the cache dir, gdnctl's compile log aside)


@dataclass(frozen=True)
class MachineFacts:
    python_version: str
    torch_version: str | None = None
    torch_cuda: str | None = None  # CUDA torch was built for
    torch_error: str | None = None  # why torch could not be imported, when installed but broken
    gpus: tuple[GpuFact, ...] = ()
    driver_version: str | None = None
    nccl_version: str | None = None
    cudnn_version: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    flash_qla_import_error: str | None = None  # None: imported fine (or not installed: see packages)
    env: dict[str, str] = field(default_factory=dict)
    kernel_cache: KernelCacheFact | None = None
    rollout_env: RolloutEnvFact | None = None  # probed only for a preset that names rollout.python

    def __post_init__(self):
        # Here rather than in the probe: facts loaded with --facts (written by an older gdnctl, or by hand) and
        # facts built in code pass through the same gate before any report, --json or --save-facts sees them.
        object.__setattr__(self, "env", redact_env(self.env))

    def version(self, distribution: str) -> str | None:
        return self.packages.get(distribution)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "MachineFacts":
        gpus = tuple(GpuFact(g["name"], tuple(g["sm"]), g["memory_gib"]) for g in data.get("gpus", ()))
        cache = data.get("kernel_cache")
        rollout = data.get("rollout_env")
        return cls(**{**data, "gpus": gpus, "kernel_cache": KernelCacheFact(**cache) if cache else None,
                      "rollout_env": RolloutEnvFact(**rollout) if rollout else None})

    @classmethod
    def load(cls, path: Path) -> "MachineFacts":
        return cls.from_json(json.loads(path.read_text()))
