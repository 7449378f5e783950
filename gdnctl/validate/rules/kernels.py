"""GDN kernel backend: FlashQLA hardware and version limits, and FLA's silent FlashQLA dispatch."""

from __future__ import annotations

from gdnctl.knowledge import FLASHQLA_FORWARD_ONLY_SMS, FLASHQLA_SMS, sm_label, stack, versions
from gdnctl.validate.findings import Issue, Severity, rule

_SUPPORTED = ", ".join(sm_label(sm) for sm in sorted(FLASHQLA_SMS))


def _flashqla(run) -> bool:
    return run.preset.kernels.gdn_backend == "flashqla"


@rule("KRN001", Severity.ERROR, "FlashQLA on an unsupported GPU")
def flashqla_gpu(run):
    """
    What it checks: kernels.gdn_backend: flashqla only on SM90, SM100, SM103, SM120 or SM121 GPUs.

    Why: FlashQLA's TileLang kernels exist only for those architectures, and `import flash_qla` raises
    ValueError on any other GPU (QwenLM/FlashQLA).

    Fix: set kernels.gdn_backend: fla, or run on a Hopper/Blackwell GPU.
    """
    if _flashqla(run) and run.gpu.sm not in FLASHQLA_SMS:
        yield Issue("kernels.gdn_backend", f"FlashQLA has no kernels for {run.gpu.description} "
                                           f"({run.gpu.sm_label}); it supports {_SUPPORTED}.",
                    "Set kernels.gdn_backend: fla, or use a Hopper or Blackwell GPU.")


@rule("KRN002", Severity.ERROR, "FlashQLA training on a forward-only GPU")
def flashqla_forward_only(run):
    """
    What it checks: FlashQLA training jobs on SM120/SM121 (RTX PRO 6000, RTX 5090, GB10).

    Why: FlashQLA ships only a forward kernel for SM120/121: there is no backward to train with.

    Fix: set kernels.gdn_backend: fla for training on these GPUs.
    """
    if _flashqla(run) and run.is_training and run.gpu.sm in FLASHQLA_FORWARD_ONLY_SMS:
        yield Issue("kernels.gdn_backend", f"FlashQLA has only a forward kernel on {run.gpu.sm_label} "
                                           f"({run.gpu.description}), so it cannot train.",
                    "Set kernels.gdn_backend: fla.")


@rule("KRN003", Severity.ERROR, "FlashQLA needs GDN head dims of 128")
def flashqla_head_dim(run):
    """
    What it checks: linear_key_head_dim and linear_value_head_dim are 128 when FlashQLA is chosen.

    Why: FlashQLA asserts K == V == 128 inside its kernels. All released Qwen3.5 sizes use 128.

    Fix: set kernels.gdn_backend: fla for other head dims.
    """
    m = run.model
    dims = {m.linear_key_head_dim, m.linear_value_head_dim}
    if _flashqla(run) and dims != {stack.FLASHQLA_HEAD_DIM}:
        yield Issue("kernels.gdn_backend", f"{m.label} has GDN head dims K={m.linear_key_head_dim}, "
                                           f"V={m.linear_value_head_dim}; FlashQLA needs 128 for both.",
                    "Set kernels.gdn_backend: fla.")


@rule("KRN004", Severity.WARNING, "flash-qla <= 0.1.2 for training")
def flashqla_training_version(run):
    """
    What it checks: runtime.flash_qla >= 0.1.3 when FlashQLA trains.

    Why: flash-qla <= 0.1.2 computes dg with a precision bug (QwenLM/FlashQLA PR #28).

    Fix: pip install 'flash-qla>=0.1.3' (needs tilelang >= 0.1.12) and set runtime.flash_qla.
    """
    version = run.stack.get("flash_qla")
    if _flashqla(run) and run.is_training and versions.below(version, stack.FLASHQLA_TRAINING_MIN):
        yield Issue("runtime.flash_qla", f"flash-qla {version} has a dg precision bug in training "
                                         "(QwenLM/FlashQLA PR #28).",
                    f"Install flash-qla >= {stack.FLASHQLA_TRAINING_MIN}.")


@rule("KRN005", Severity.ERROR, "FlashQLA chosen but not installed")
def flashqla_installed(run):
    """
    What it checks: kernels.gdn_backend: flashqla with runtime.flash_qla: none.

    Why: the runtime would stop at start-up on every rank.

    Fix: install flash-qla (and set runtime.flash_qla to its version), or use fla.
    """
    if _flashqla(run) and run.stack.get("flash_qla") is None:
        yield Issue("runtime.flash_qla", "kernels.gdn_backend is flashqla but runtime.flash_qla says it is not "
                                         "installed.",
                    f"pip install 'flash-qla>={stack.FLASHQLA_TRAINING_MIN}' and set runtime.flash_qla, or use fla.")


@rule("KRN006", Severity.INFO, "FLA would silently dispatch to FlashQLA")
def fla_pins_own_kernels(run):
    """
    What it checks: kernels.gdn_backend: fla while flash-qla is installed on a GPU FlashQLA supports.

    Why: FLA 0.6 sends `chunk_gated_delta_rule` to FlashQLA whenever `flash_qla` imports on
    SM90/100/103/120 (fla/ops/gated_delta_rule/backends/flash_qla.py, default on), so "fla" would quietly
    mean FlashQLA. gdnctl's runtime sets FLA_FLASH_QLA=0 so fla means FLA's own Triton kernels.

    Fix: nothing to do; choose kernels.gdn_backend: flashqla if you want FlashQLA.
    """
    if (run.preset.kernels.gdn_backend == "fla" and run.stack.get("flash_qla") is not None
            and run.gpu.sm in FLASHQLA_SMS and run.is_training):
        yield Issue("kernels.gdn_backend", "flash-qla is installed, so FLA would dispatch to it silently; the "
                                           "runtime sets FLA_FLASH_QLA=0 to keep FLA's own kernels.",
                    "Nothing to do; set kernels.gdn_backend: flashqla to use FlashQLA.")
