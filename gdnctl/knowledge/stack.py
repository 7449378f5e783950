"""What each version of the software stack can do for GDN models: one table per package.

Every version threshold a rule uses lives here, with its source; rules read these tables and never
hard-code a version. Each comment names its upstream source; docs/sources.md states the facts behind them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gdnctl.knowledge import versions

# The stack gdnctl is pinned to and tested against; `runtime:` in a preset overrides any of these.
DEFAULT_STACK: dict[str, str | None] = {
    "megatron_core": "0.19.2",
    "megatron_bridge": "0.6.2",
    # The trainer's Transformer Engine: with one, the model is built through megatron-bridge (TE layers, context
    # parallel, FP8); `runtime.transformer_engine: none` selects gdnctl's TE-free builder. 2.20.2 is what the
    # bridge path was checked with on an H100 (the GPU machines' staged `te` profile).
    "transformer_engine": "2.20.2",
    "vllm": "0.33.0",
    "flash_qla": "0.1.3",
    "fla": "0.6.0",
    "cudnn": None,  # unknown unless the preset says; `gdnctl doctor` reads the real one
    "triton": None,  # the trainer's Triton (FLA's kernels); unknown unless the preset says
    # The trainer's transformers: only the rl policy on device cpu imports it. Unknown unless the preset says
    # (pyproject's runtime extra asks for >= 5.23, while megatron-bridge 0.6.2 pins <= 5.12.1).
    "transformers": None,
}

# --- Megatron-Core (megatron/core/ssm/gated_delta_net*) ----------------------------------------------
MCORE_GDN = "0.16.0"  # first release with GatedDeltaNet
MCORE_GDN_PACKED_AND_CP = "0.18.0"  # THD packed sequences (PR #2645) and all-to-all CP (PR #2642)
MCORE_KV_HEAD_REPLICATION = "0.16.0"  # TP a multiple of the query groups (Megatron-LM PR #2565); before: divisors
MCORE_GDN_FUSED_CP_A2A = "0.19.0"  # one fused all-to-all per forward (PR #4913: 7-10% iteration speedup)
# cuDNN <= 9.18's varlen fused attention gives NaN gradients on Hopper: the full-attention layers of packed
# (THD) Qwen3.5 training (Megatron-LM PR #2644's description, issue #5044; LAY010).
CUDNN_HOPPER_THD_MIN = "9.19.0"

# What each threshold gives, as `gdnctl doctor` reports it: (first version, feature).
MCORE_GDN_FEATURES: tuple[tuple[str, str], ...] = (
    (MCORE_GDN, "GDN"),
    (MCORE_GDN_PACKED_AND_CP, "THD"),
    (MCORE_GDN_PACKED_AND_CP, "CP"),
    (MCORE_GDN_FUSED_CP_A2A, "fused CP all-to-all"),
)

# --- Transformer Engine ---------------------------------------------------------------------------------
# NVTE_USE_CUTLASS_GROUPED_GEMM=1 sends grouped GEMMs (the MoE experts') to CUTLASS instead of cuBLAS: read by
# nvte_multi_tensor_gemm (transformer_engine/common/gemm/cublaslt_gemm.cu) from v2.8 on, on SM90 only, for bf16/fp16
# without a fused bias or GELU and with one K, a multiple of 128, across the group; every other call takes cuBLAS.
TE_CUTLASS_GROUPED_GEMM = "2.8.0"

# --- Megatron-Bridge ------------------------------------------------------------------------------------
# Which release bridges which model family (and takes TP above its KV heads) is the family's entry in
# model_families.py.
BRIDGE_MTP_SEQUENCE_PARALLEL_FIX = "0.5.0"  # MTP shadow-embedding bug with SP (PR #3143)
BRIDGE_MTP_CONTEXT_PARALLEL_FIX = "0.6.0"  # MTP + CP shape fix
# LoRA(share_expert_adapters=False): one adapter per grouped (TE grouped-GEMM) expert, GroupedExpertLinearAdapter
# (PR #3408, commit 747caeb). Before it every grouped expert of an EP rank shares one adapter (peft/lora.py 0.4.2),
# which no Hugging Face adapter layout holds.
BRIDGE_LORA_PER_EXPERT = "0.5.0"
# What doctor reports of a megatron-bridge beyond its model families' bridges (model_families.bridge_features).
BRIDGE_FEATURES: tuple[tuple[str, str], ...] = (
    (BRIDGE_MTP_SEQUENCE_PARALLEL_FIX, "MTP+SP fix"),
    (BRIDGE_MTP_CONTEXT_PARALLEL_FIX, "MTP+CP fix"),
)
# Each bridge minor release is built against one megatron-core minor release.
BRIDGE_CORE_PAIRING: dict[str, str] = {"0.4": "0.17", "0.5": "0.18", "0.6": "0.19"}

# --- FlashQLA -------------------------------------------------------------------------------------------
FLASHQLA_TRAINING_MIN = "0.1.3"  # <= 0.1.2 has a dg precision bug (QwenLM/FlashQLA PR #28; fix: commit 6e5d2ea)
FLASHQLA_HEAD_DIM = 128  # K == V == 128 is asserted inside the kernels
FLASHQLA_MIN_TORCH = "2.8"  # QwenLM/FlashQLA README and wheel metadata
FLASHQLA_MIN_CUDA = "12.8"
FLASHQLA_MIN_TILELANG = "0.1.12"  # flash-qla 0.1.3's requirement

# FlashQLA kernels by GPU: the first flash-qla release with a forward kernel for each compute capability. Before
# it, `import flash_qla` raises ValueError on that GPU. SM90 from v0.1.0; SM100 from v0.1.1 and SM120 (forward
# only) from v0.1.2 (README news of each release, QwenLM/FlashQLA tags v0.1.1, v0.1.2); SM103 (commit 1563fbd,
# PR #29) and SM121 (commit 55708e1, PR #33) landed after v0.1.2, and the 0.1.3 wheel dispatches both.
FLASHQLA_FORWARD_SINCE: dict[tuple[int, int], str] = {
    (9, 0): "0.1.0",
    (10, 0): "0.1.1",
    (12, 0): "0.1.2",
    (10, 3): "0.1.3",
    (12, 1): "0.1.3",
}
# flash-qla 0.1.3 adds an SM120/SM121 backward: its chunk/__init__.py imports fused_gdr_bwd from
# blackwell_sm120/fused_bwd.py for compute versions 12.0 and 12.1 (v0.1.2 set it to None on 12.0). Before it
# those GPUs are forward-only (KRN002 and the runtime refuse training there).
FLASHQLA_SM120_BACKWARD = "0.1.3"

# --- FLA (fla-core / flash-linear-attention) by Triton and GPU ------------------------------------------------
# Hopper: Triton >= 3.4.0 and < 3.7.1 miscompiles FLA's gated `chunk_bwd_kernel_dqkwg` at a 64-wide K tile, so the
# GDN backward gives wrong dk -> db/dg (fla-org/flash-linear-attention #640, root cause in PR #826). FLA <= 0.4.1
# tiles K at 64 on Hopper and computes the wrong gradients silently; 0.4.2 tiles at 128 on Hopper (PR #751), which
# the #640 root-cause comment says sidesteps the broken path; 0.5.0 (PR #827) raises RuntimeError at the first
# backward on Hopper with Triton >= 3.4.0 unless its TileLang backend (tilelang + nvcc) takes the kernel; 0.5.2
# (PR #983: "fixed in Triton 3.7.1") raises only for Triton < 3.7.1. fla-core 0.6.0's chunk_o.py keeps that guard.
FLA_HOPPER_BAD_TRITON = ("3.4.0", "3.7.1")  # [first broken, first fixed) Triton release
FLA_HOPPER_TILE_128 = "0.4.2"  # first FLA whose Hopper tile avoids the reported 64-wide path
FLA_HOPPER_GUARD = "0.5.0"  # first FLA that refuses the broken combination instead of computing wrong gradients
# Blackwell: the GDN backward gives NaN gradients or hangs with FLA <= 0.5.1 (fla #913: silent NaN gradients from
# chunk_gated_delta_rule backward on B200 with FLA 0.5.0 and Triton 3.7.0; fla #999: backward hang in
# prepare_wy_repr_bwd on B200). 0.5.2 restricts the Blackwell configs (PR #953: forward-h kernel at 2 warps for a
# Triton tl.dot race; PR #1000: prepare_wy_repr_bwd at 2 warps / 4 stages). QwenLM/FlashQLA PR #28 pinned an FLA
# commit because "released 0.5.1 fails on SM100".
FLA_BLACKWELL_BACKWARD_FIX = "0.5.2"

# --- transformers and vLLM by model family ----------------------------------------------------------------
# The first release with each model family's classes is the family's entry in model_families.py.

# --- vLLM ------------------------------------------------------------------------------------------------
# `--gdn-prefill-backend` choices by the first vLLM release that offers them; no flag before 0.18.0.
VLLM_GDN_PREFILL_BACKENDS_SINCE: dict[str, str] = {
    "flashinfer": "0.18.0",
    "triton": "0.18.0",
    "cutedsl": "0.22.0",
    "aiter_flydsl": "0.32.0",
    "sycl": "0.33.0",
}
VLLM_GDN_PREFILL_FLAG = "0.18.0"
# Backends reported to hang in GDN prefill on SM90: flashinfer #2623, #3329, #3986; vllm #38916, #41865.
VLLM_SM90_HANGING_PREFILL = ("auto", "flashinfer")
# The hang reports ran FlashInfer's CUTLASS/JIT SM90 GDN prefill (vLLM <= 0.25 pins flashinfer-python <= 0.6.13:
# 0.25.1's metadata pins ==0.6.13). flashinfer 0.6.14 replaced it with a CuTe-DSL kernel (flashinfer PR #3477,
# first tagged in v0.6.14), on which #3329's reproducer no longer hangs (maintainer comment there); vLLM 0.26.0 is
# the first release pinning flashinfer-python==0.6.14 (its wheel metadata).
VLLM_FLASHINFER_CUTEDSL_SM90 = "0.26.0"


def features_of(version: str, table: tuple[tuple[str, str], ...]) -> list[str]:
    """The features of `table` that `version` has."""
    return [feature for since, feature in table if versions.at_least(version, since)]


def vllm_gdn_prefill_backends(vllm_version: str) -> tuple[str, ...]:
    return tuple(
        name for name, since in VLLM_GDN_PREFILL_BACKENDS_SINCE.items() if versions.at_least(vllm_version, since)
    )


# --- Dependency pins that decide whether trainer and rollout can share one Python environment ----------
@dataclass(frozen=True)
class Pins:
    package: str
    version: str
    requires: dict[str, str]  # dependency -> specifier


KNOWN_PINS: dict[tuple[str, str], Pins] = {
    ("megatron_bridge", "0.6.2"): Pins(
        "megatron-bridge", "0.6.2", {"transformers": "<=5.12.1", "flashinfer-python": "==0.6.8.post1"}
    ),
    ("vllm", "0.33.0"): Pins(
        "vllm", "0.33.0", {"transformers": ">=5.16.1", "flashinfer-python": "==0.7.2.post1", "torch": "==2.14.0"}
    ),
}

# Versions probed to find whether two specifiers admit a common release.
_PROBE_VERSIONS = {
    "transformers": [f"5.{m}.{p}" for m in range(25) for p in range(4)],
    "flashinfer-python": ["0.6.8.post1", "0.7.2.post1"],
    "torch": ["2.11.0", "2.12.0", "2.13.0", "2.14.0"],
}


def pin_conflicts(trainer: Pins, rollout: Pins) -> list[str]:
    """Dependencies whose requirements in the two packages admit no common version."""
    from packaging.specifiers import SpecifierSet  # only rl presets with known pins get here

    conflicts = []
    for dep, trainer_spec in trainer.requires.items():
        rollout_spec = rollout.requires.get(dep)
        if rollout_spec is None:
            continue
        candidates = set(_PROBE_VERSIONS.get(dep, []))
        for spec in (trainer_spec, rollout_spec):
            if spec.startswith("=="):
                candidates.add(spec[2:])
        both = SpecifierSet(trainer_spec) & SpecifierSet(rollout_spec)
        if not any(both.contains(v, prereleases=True) for v in candidates):
            conflicts.append(
                f"{dep} ({trainer.package} {trainer.version} needs {trainer_spec}, "
                f"{rollout.package} {rollout.version} needs {rollout_spec})"
            )
    return conflicts
