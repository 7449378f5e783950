"""Thin probes that read this machine into MachineFacts. All judgement lives in checks.py.

Kernel packages are looked up by metadata, never imported here: `import flash_qla` raises (or worse) on an
unsupported GPU, so it is tried in a child process with a time limit.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gdnctl.doctor.facts import (
    ENV_NAMES,
    ENV_PREFIXES,
    PACKAGES,
    GpuFact,
    InterpreterFact,
    KernelCacheFact,
    MachineFacts,
    RolloutEnvFact,
)
from gdnctl.knowledge import FLASHQLA
from gdnctl.plan import DEFAULT_KERNEL_CACHE
from gdnctl.runtime.kernels import cached_kernel_files
from gdnctl.validate import replaceable_by_others

IMPORT_TIMEOUT_S = 120


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_facts() -> dict:
    try:
        import torch
    except ImportError:
        return {}
    except Exception as err:  # a broken install (missing CUDA libraries, ABI mismatch) must not crash doctor
        return {"torch_error": f"{type(err).__name__}: {err}"}
    facts: dict = {"torch_version": torch.__version__, "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        gpus = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append(GpuFact(props.name, (props.major, props.minor), round(props.total_memory / 1024**3, 1)))
        facts["gpus"] = tuple(gpus)
        nccl = torch.cuda.nccl.version()
        facts["nccl_version"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if cudnn:
        facts["cudnn_version"] = cudnn_version_text(cudnn)
    return facts


def cudnn_version_text(number: int) -> str:
    """torch's integer cuDNN version as text: cuDNN 9 encodes major*10000 + minor*100 + patch (91900 is
    9.19.0), cuDNN 8 and older major*1000 + minor*100 + patch (8902 is 8.9.2)."""
    if number >= 10000:
        return f"{number // 10000}.{number % 10000 // 100}.{number % 100}"
    return f"{number // 1000}.{number % 1000 // 100}.{number % 100}"


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.splitlines()[0] if out else None


def _flash_qla_import_error() -> str | None:
    if all(_version(name) is None for name in FLASHQLA.distributions):
        return None
    statement = f"import {FLASHQLA.import_name}"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", statement], capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"{statement} did not finish within {IMPORT_TIMEOUT_S} s"
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"{statement} exited with {proc.returncode}"


def _kernel_cache(path: str) -> KernelCacheFact:
    directory = Path(os.path.expanduser(path))
    if not directory.exists():
        parent = next((p for p in directory.parents if p.exists()), Path("/"))
        return KernelCacheFact(str(directory), False, os.access(parent, os.W_OK), 0)
    return KernelCacheFact(str(directory), True, os.access(directory, os.W_OK), cached_kernel_files(directory))


# vLLM's version, and whether gdnctl's runtime is found beside it, on the probe's last line.
_ROLLOUT_PROBE = """import importlib.util
import vllm
try:
    runtime = importlib.util.find_spec("gdnctl.runtime") is not None
except ImportError:
    runtime = False
print(vllm.__version__, runtime)
"""


def rollout_env(python: str) -> RolloutEnvFact:
    """vLLM's version in another interpreter: imported there, in a child process with a time limit. Not run when
    another user could have put that interpreter there: the doctor would run their code as you."""
    replaceable = replaceable_by_others(python)
    if replaceable is not None:
        return RolloutEnvFact(python, None, f"not run: another user could replace it ({replaceable})")
    try:
        # From /, so that a gdnctl in the current directory does not stand in for the one installed there.
        proc = subprocess.run(
            [python, "-c", _ROLLOUT_PROBE],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
            check=False,
            cwd="/",
        )
    except FileNotFoundError:
        return RolloutEnvFact(python, None, "no such interpreter")
    except (PermissionError, subprocess.TimeoutExpired) as error:
        return RolloutEnvFact(python, None, type(error).__name__)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return RolloutEnvFact(python, None, lines[-1] if lines else f"exit code {proc.returncode}")
    version, runtime = proc.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    return RolloutEnvFact(python, version, gdnctl_runtime=runtime == "True")


def gather(
    kernel_cache_dir: str | None = None, rollout_python: str | None = None, interpreters: Sequence[tuple[str, str]] = ()
) -> MachineFacts:
    """`interpreters`: (field, command) of the interpreters a preset makes gdnctl run, judged for who could
    replace them."""
    env = {k: v for k, v in os.environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    cache = kernel_cache_dir or os.environ.get("TILELANG_CACHE_DIR") or DEFAULT_KERNEL_CACHE
    return MachineFacts(
        python_version=platform.python_version(),
        driver_version=_driver_version(),
        packages={name: _version(name) for name in PACKAGES},
        flash_qla_import_error=_flash_qla_import_error(),
        env=env,
        kernel_cache=_kernel_cache(cache),
        rollout_env=rollout_env(rollout_python) if rollout_python else None,
        interpreters=tuple(
            InterpreterFact(field, command, replaceable_by_others(command)) for field, command in interpreters
        ),
        **_torch_facts(),
    )
