"""What the doctor knows about a machine: plain data, saved and loaded as JSON so checks can be replayed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from gdnctl.errors import GdnctlError
from gdnctl.files import UnreadableFile, read_text
from gdnctl.knowledge import KERNEL_DISTRIBUTIONS

# Distributions the doctor looks up (by metadata, without importing them): torch, every GDN kernel backend's, and
# those of training and rollouts.
PACKAGES = (
    "torch",
    *KERNEL_DISTRIBUTIONS,
    "megatron-core",
    "megatron-bridge",
    "transformer-engine",
    "transformer_engine",
    "vllm",
    "nvidia-cudnn-cu12",
    "nvidia-cudnn-cu13",
    "transformers",
)
# Environment variables the env lint reads; the only ones facts record (cli.py's doctor help lists them too).
ENV_NAMES = (
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "FLA_FLASH_QLA",
    "FLA_DISABLE_BACKEND_DISPATCH",
    "TILELANG_CACHE_DIR",
    "CUDA_VISIBLE_DEVICES",
)
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")
# Facts are shared and pasted into issues, so a variable whose name looks like a credential keeps its name (the
# env lint still sees that it is set) and loses its value: a prefix such as NCCL_ matches whatever a site or a
# plugin chose to call its variables.
CREDENTIAL_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
REDACTED = "<redacted>"
# A facts file is a few KiB; this bounds what --facts reads (a device or a huge file is refused, not read).
MAX_FACTS_BYTES = 16 * 1024**2


class FactsFileError(GdnctlError):
    """A --facts file that is not what --save-facts writes."""


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
    # Whether gdnctl's runtime is found there (the rollout server is `python -m gdnctl.runtime`); None: not asked
    # (vLLM did not import, or facts saved before doctor asked).
    gdnctl_runtime: bool | None = None


@dataclass(frozen=True)
class InterpreterFact:
    """An interpreter the preset makes gdnctl run (launch.python, rollout.python), and whether another user could
    replace it (gdnctl/validate/filesystem.py: the same judgement as validate's LCH006)."""

    field: str
    command: str
    replaceable: str | None  # why another user could replace it; None: only you or root can


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
    interpreters: tuple[InterpreterFact, ...] = ()  # probed only with a preset

    def __post_init__(self):
        # Here rather than in the probe: facts loaded with --facts (written by an older gdnctl, or by hand) and
        # facts built in code pass through the same gate before any report, --json or --save-facts sees them.
        object.__setattr__(self, "env", redact_env(self.env))

    def version(self, distribution: str) -> str | None:
        return self.packages.get(distribution)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> MachineFacts:
        return _adapter().validate_python(data)

    @classmethod
    def load(cls, path: Path) -> MachineFacts:
        """Facts saved with --save-facts, every field of its type (strictly: a number is no version, an env value
        is text); FactsFileError with the field otherwise."""
        fix = "save them again with `gdnctl doctor --save-facts FILE`"
        try:
            data = read_text(path, MAX_FACTS_BYTES)
        except UnreadableFile as error:
            raise FactsFileError(f"{error}; {fix}.") from None
        try:
            return _adapter().validate_json(data, strict=True)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the top level"
            raise FactsFileError(
                f"{path} is not a facts file written by --save-facts ({where}: {first['msg'].lower()}); {fix}."
            ) from None


@cache
def _adapter() -> TypeAdapter:
    return TypeAdapter(MachineFacts)
