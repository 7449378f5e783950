"""GDN kernel backend: FlashQLA hardware and version limits, and FLA's silent FlashQLA dispatch."""

from __future__ import annotations

from collections.abc import Iterator

from gdnctl.knowledge import FLA, FLASHQLA, sm_label, stack, versions
from gdnctl.plan import Run
from gdnctl.validate.findings import Issue, Severity, rule

_SUPPORTED = ", ".join(sm_label(sm) for sm in sorted(FLASHQLA.gpus or ()))


def _flashqla(run: Run) -> bool:
    return run.preset.kernels.gdn_backend == FLASHQLA.name


def _fla(run: Run) -> bool:
    return run.preset.kernels.gdn_backend == FLA.name


@rule("KRN001", Severity.ERROR, "FlashQLA on an unsupported GPU")
def flashqla_gpu(run: Run) -> Iterator[Issue]:
    """
    What it checks: kernels.gdn_backend: flashqla only on SM90, SM100, SM103, SM120 or SM121 GPUs.

    Why: FlashQLA's TileLang kernels exist only for those architectures, and `import flash_qla` raises
    ValueError on any other GPU (QwenLM/FlashQLA).

    Source: QwenLM/FlashQLA README (SM90, SM100, SM103, SM120, SM121: gdnctl/knowledge/hardware.py FLASHQLA_SMS);
    `import flash_qla` raises ValueError on other GPUs (docs/sources.md "GDN kernels").

    Fix: set kernels.gdn_backend: fla, or run on a Hopper/Blackwell GPU.
    """
    if _flashqla(run) and not FLASHQLA.has_kernels_for(run.gpu.sm):
        yield Issue(
            "kernels.gdn_backend",
            f"FlashQLA has no kernels for {run.gpu.description} ({run.gpu.sm_label}); it supports {_SUPPORTED}.",
            "Set kernels.gdn_backend: fla, or use a Hopper or Blackwell GPU.",
        )


@rule("KRN002", Severity.ERROR, "FlashQLA training on a GPU its release has no backward for")
def flashqla_forward_only(run: Run) -> Iterator[Issue]:
    """
    What it checks: FlashQLA training jobs on SM120/SM121 (RTX PRO 6000, RTX 5090, GB10) with a flash-qla older
    than 0.1.3.

    Why: flash-qla 0.1.2 ships only a forward kernel for SM120: its `chunk_gated_delta_rule_bwd` raises
    NotImplementedError there. flash-qla 0.1.3 adds the SM120/SM121 backward (chunk size 32), so from 0.1.3 the rule
    is quiet and the runtime (runtime/kernels/backends.py) trains there. gdnctl's own GPU tests ran on H100 and
    H200 only: check the backward on such a GPU with `gdnctl doctor PRESET --kernels` before a long run.

    Source: QwenLM/FlashQLA v0.1.2 flash_qla/ops/gated_delta_rule/chunk/__init__.py (`fused_gdr_bwd = None` on
    12.0); the flash-qla 0.1.3 wheel's flash_qla/ops/gated_delta_rule/chunk/__init__.py, which imports
    fused_gdr_fwd and fused_gdr_bwd from chunk/blackwell_sm120/ for compute versions 12.0 and 12.1
    (docs/sources.md "GDN kernels"; gdnctl/knowledge/stack.py FLASHQLA_SM120_BACKWARD).

    Fix: set runtime.flash_qla to 0.1.3 or later and install it, or set kernels.gdn_backend: fla.
    """
    version = run.stack.get(FLASHQLA.runtime_field)
    if (
        _flashqla(run)
        and run.is_training
        and run.gpu.sm in FLASHQLA.forward_only_gpus
        and versions.below(version, stack.FLASHQLA_SM120_BACKWARD)
    ):
        yield Issue(
            "runtime.flash_qla",
            f"flash-qla {version} has only a forward kernel on {run.gpu.sm_label} "
            f"({run.gpu.description}), so it cannot train.",
            f"Install flash-qla >= {stack.FLASHQLA_SM120_BACKWARD} and set runtime.flash_qla to it, or "
            "set kernels.gdn_backend: fla.",
        )


@rule("KRN003", Severity.ERROR, "FlashQLA needs GDN head dims of 128")
def flashqla_head_dim(run: Run) -> Iterator[Issue]:
    """
    What it checks: linear_key_head_dim and linear_value_head_dim are 128 when FlashQLA is chosen.

    Why: FlashQLA asserts K == V == 128 inside its kernels. All released Qwen3.5 sizes use 128.

    Source: FlashQLA's in-kernel K == V == 128 assertion (docs/sources.md "GDN kernels"; gdnctl/knowledge/stack.py
    FLASHQLA_HEAD_DIM).

    Fix: set kernels.gdn_backend: fla for other head dims.
    """
    m = run.model
    dims = {m.linear_key_head_dim, m.linear_value_head_dim}
    if _flashqla(run) and dims != {stack.FLASHQLA_HEAD_DIM}:
        yield Issue(
            "kernels.gdn_backend",
            f"{m.label} has GDN head dims K={m.linear_key_head_dim}, "
            f"V={m.linear_value_head_dim}; FlashQLA needs 128 for both.",
            "Set kernels.gdn_backend: fla.",
        )


@rule("KRN004", Severity.WARNING, "flash-qla <= 0.1.2 for training")
def flashqla_training_version(run: Run) -> Iterator[Issue]:
    """
    What it checks: runtime.flash_qla >= 0.1.3 when FlashQLA trains.

    Why: flash-qla <= 0.1.2 computes dg with a precision bug (QwenLM/FlashQLA PR #28).

    Source: QwenLM/FlashQLA PR #28 found it and was closed; the fix is commit 6e5d2ea ("Fix dg accuracy by
    high-precision matrix transposition", 2026-07-28), after the v0.1.2 tag (2026-07-09).

    Fix: pip install 'flash-qla>=0.1.3' (needs tilelang >= 0.1.12) and set runtime.flash_qla.
    """
    version = run.stack.get(FLASHQLA.runtime_field)
    if _flashqla(run) and run.is_training and versions.below(version, stack.FLASHQLA_TRAINING_MIN):
        yield Issue(
            "runtime.flash_qla",
            f"flash-qla {version} has a dg precision bug in training (QwenLM/FlashQLA PR #28).",
            f"Install flash-qla >= {stack.FLASHQLA_TRAINING_MIN}.",
        )


@rule("KRN005", Severity.ERROR, "FlashQLA chosen but not installed")
def flashqla_installed(run: Run) -> Iterator[Issue]:
    """
    What it checks: kernels.gdn_backend: flashqla with runtime.flash_qla: none.

    Why: the runtime would stop at start-up on every rank.

    Source: gdnctl's runtime: runtime/kernels/backends.py refuses the flashqla backend at start-up when flash-qla is
    not installed.

    Fix: install flash-qla (and set runtime.flash_qla to its version), or use fla.
    """
    if _flashqla(run) and run.stack.get(FLASHQLA.runtime_field) is None:
        yield Issue(
            "runtime.flash_qla",
            "kernels.gdn_backend is flashqla but runtime.flash_qla says it is not installed.",
            f"pip install 'flash-qla>={stack.FLASHQLA_TRAINING_MIN}' and set runtime.flash_qla, or use fla.",
        )


@rule("KRN006", Severity.INFO, "FLA would silently dispatch to FlashQLA")
def fla_pins_own_kernels(run: Run) -> Iterator[Issue]:
    """
    What it checks: kernels.gdn_backend: fla while the preset's runtime pins flash-qla (runtime.flash_qla, or
    the pinned stack's default; what this machine has installed is `gdnctl doctor`'s) on a GPU FlashQLA supports.

    Why: FLA 0.6 sends `chunk_gated_delta_rule` to FlashQLA whenever `flash_qla` imports on
    SM90/100/103/120 (fla/ops/gated_delta_rule/backends/flash_qla.py, default on), so "fla" would quietly
    mean FlashQLA. gdnctl's runtime sets FLA_FLASH_QLA=0 so fla means FLA's own Triton kernels.

    Source: FLA 0.6's fla/ops/gated_delta_rule/backends/flash_qla.py (default_enable=True; docs/sources.md "GDN
    kernels"); gdnctl's FLA_FLASH_QLA=0 (FLA's environment in knowledge/gdn_backends.py).

    Fix: nothing to do; choose kernels.gdn_backend: flashqla if you want FlashQLA.
    """
    if (
        _fla(run)
        and run.stack.get(FLASHQLA.runtime_field) is not None
        and FLASHQLA.has_kernels_for(run.gpu.sm)
        and run.is_training
    ):
        # run.stack holds the preset's runtime: pins (and their defaults), not what this machine has installed.
        yield Issue(
            "kernels.gdn_backend",
            f"the preset's runtime pins flash-qla {run.stack['flash_qla']} "
            "(runtime.flash_qla), and where it is installed FLA would dispatch to it "
            "silently; the runtime sets FLA_FLASH_QLA=0 to keep FLA's own kernels.",
            "Nothing to do; set kernels.gdn_backend: flashqla to use FlashQLA.",
        )


@rule("KRN007", Severity.ERROR, "FLA's GDN backward on Hopper with Triton 3.4-3.7.0")
def fla_hopper_triton_backward(run: Run) -> Iterator[Issue]:
    """
    What it checks: training with kernels.gdn_backend: fla on a Hopper GPU (SM90) when runtime.triton is
    >= 3.4.0 and < 3.7.1, by runtime.fla: error for FLA <= 0.4.1 (wrong gradients, silently); warning for
    FLA 0.4.2-0.4.x (no guard) and for FLA >= 0.5.0 (it stops at the first backward unless its TileLang
    backend takes the kernel); info for FLA >= 0.5.0 with flash-qla installed (which brings tilelang).
    Quiet while runtime.triton is unset (unknown): `gdnctl doctor` reads the installed one.

    Why: Triton 3.4-3.7.0 miscompiles FLA's gated `chunk_bwd_kernel_dqkwg` on Hopper at a 64-wide K tile
    (`tl.trans` of a wgmma-layout tensor), so dk and from it db and dg come out wrong while the forward is
    right. FLA <= 0.4.1 uses that tile on Hopper; 0.4.2 switched Hopper to a 128 tile, which the issue's
    root-cause comment says avoids the broken path (not confirmed for every shape, and FLA itself does not
    rely on it); 0.5.0 raises RuntimeError on Hopper with Triton >= 3.4.0 unless tilelang (and, from 0.5.2, a
    usable nvcc) lets its TileLang dqkwg kernel run; 0.5.2 narrows that to Triton < 3.7.1, where the Triton
    bug is fixed. Either way the failure shows only after the job has its GPUs. Confirmed from FLA's code and the
    issue; not reproduced on a GPU here.

    Source: fla-org/flash-linear-attention #640 (report, root cause), PR #826 (diagnosis), PR #751 (Hopper tile
    128, v0.4.2), PR #827 (TileLang backend and guard, v0.5.0), PR #983 (guard narrowed to Triton < 3.7.1,
    v0.5.2); fla/ops/common/chunk_o.py `chunk_bwd_dqkwg` at each tag and in fla-core 0.6.0.

    Fix: use Triton >= 3.7.1 (or < 3.4) and say so in runtime.triton; or install tilelang with FLA >= 0.5.0;
    or set kernels.gdn_backend: flashqla.
    """
    triton, fla = run.stack.get("triton"), run.stack.get(FLA.runtime_field)
    if not _fla(run) or not run.is_training or not run.gpu.is_hopper or triton is None or fla is None:
        return
    first_bad, fixed = stack.FLA_HOPPER_BAD_TRITON
    if not (versions.at_least(triton, first_bad) and versions.below(triton, fixed)):
        return
    broken = (
        f"Triton {triton} miscompiles FLA's gated GDN backward kernel (chunk_bwd_dqkwg) on "
        f"{run.gpu.sm_label} (fla #640)"
    )
    fix = (
        f"Use Triton >= {fixed} and set runtime.triton, install tilelang with FLA >= {stack.FLA_HOPPER_GUARD}, "
        "or set kernels.gdn_backend: flashqla."
    )
    if versions.below(fla, stack.FLA_HOPPER_TILE_128):
        yield Issue("runtime.triton", f"{broken}: FLA {fla} computes wrong db and dg gradients without an error.", fix)
    elif versions.below(fla, stack.FLA_HOPPER_GUARD):
        yield Issue(
            "runtime.triton",
            f"{broken}; FLA {fla} has no guard against it, and only its Hopper tile "
            "size is said to avoid the broken path.",
            fix,
            Severity.WARNING,
        )
    elif run.stack.get(FLASHQLA.runtime_field) is not None:
        yield Issue(
            "runtime.triton",
            f"{broken}; FLA {fla} hands that kernel to its TileLang backend, which "
            "needs tilelang (flash-qla brings it) and a usable nvcc.",
            fix,
            Severity.INFO,
        )
    else:
        yield Issue(
            "runtime.triton",
            f"{broken}; FLA {fla} raises RuntimeError at the first backward unless tilelang is installed.",
            fix,
            Severity.WARNING,
        )


@rule("KRN008", Severity.ERROR, "FLA's GDN backward on Blackwell before FLA 0.5.2")
def fla_blackwell_backward(run: Run) -> Iterator[Issue]:
    """
    What it checks: training with kernels.gdn_backend: fla on a Blackwell GPU (SM100/103/120/121) with
    runtime.fla < 0.5.2.

    Why: on B200 the GDN backward of FLA <= 0.5.1 returns NaN gradients silently (FLA 0.5.0, Triton 3.7.0) or
    hangs inside `prepare_wy_repr_bwd` on long sequences, which a distributed job shows as an NCCL watchdog
    timeout much later. FLA 0.5.2 restricts the Blackwell kernel configs that race (Triton's `tl.dot`
    recurrence race) or hang. The reports are from SM100; FLA applies its Blackwell settings to SM120/121 too
    (since 0.5.1, PR #940), so gdnctl does as well. That 0.5.2 ends the NaN gradients of #913 is inferred from
    those changes and QwenLM/FlashQLA PR #28 ("released 0.5.1 fails on SM100"); #913 itself closed as stale
    without naming a fix. fla-core 0.6.0 also narrows its Blackwell configs by itself while Triton < 3.8
    (`BLACKWELL_8_WARP_RACE`, triton #10590). Not reproduced on a GPU here.

    Source: fla-org/flash-linear-attention #913 (NaN gradients, B200, FLA 0.5.0, Triton 3.7.0), #999 and PR #1000
    (backward hang, fixed in v0.5.2), PR #953 (v0.5.2), PR #940 (v0.5.1); QwenLM/FlashQLA PR #28.

    Fix: install FLA >= 0.5.2 (fla-core) and set runtime.fla, or set kernels.gdn_backend: flashqla.
    """
    fla = run.stack.get(FLA.runtime_field)
    if _fla(run) and run.is_training and run.gpu.is_blackwell and versions.below(fla, stack.FLA_BLACKWELL_BACKWARD_FIX):
        yield Issue(
            "runtime.fla",
            f"FLA {fla}'s GDN backward gives NaN gradients or hangs on Blackwell ({run.gpu.sm_label}; fla #913, #999).",
            f"Install FLA >= {stack.FLA_BLACKWELL_BACKWARD_FIX} and set runtime.fla, or set "
            "kernels.gdn_backend: flashqla.",
        )


@rule("KRN009", Severity.ERROR, "flash-qla release has no kernels for this GPU")
def flashqla_release_gpu(run: Run) -> Iterator[Issue]:
    """
    What it checks: kernels.gdn_backend: flashqla with a runtime.flash_qla older than the first release with
    kernels for the GPU: SM120 needs flash-qla >= 0.1.2; SM103 and SM121 need >= 0.1.3 (SM90 and SM100: every
    release on PyPI). KRN001 covers GPUs no release supports.

    Why: `import flash_qla` picks its kernels by compute capability and raises ValueError for any other one
    ("FlashQLA now support sm90 and sm100 only" in 0.1.1), so every rank stops at start-up.

    Source: QwenLM/FlashQLA flash_qla/ops/gated_delta_rule/chunk/__init__.py at tags v0.1.1 (9.0, 10.0) and
    v0.1.2 (+12.0), and in the flash-qla 0.1.3 wheel (+10.3, 12.1); commits 1563fbd (SM103) and 55708e1 (SM121)
    came after v0.1.2.

    Fix: install a flash-qla release that has kernels for this GPU and set runtime.flash_qla, or use fla.
    """
    version = run.stack.get(FLASHQLA.runtime_field)
    since = None if run.gpu.sm is None else stack.FLASHQLA_FORWARD_SINCE.get(run.gpu.sm)
    if _flashqla(run) and since is not None and versions.below(version, since):
        yield Issue(
            "runtime.flash_qla",
            f"flash-qla {version} has no kernels for {run.gpu.sm_label} "
            f"({run.gpu.description}); they arrived in {since}.",
            f"Install flash-qla >= {since} and set runtime.flash_qla, or set kernels.gdn_backend: fla.",
        )
