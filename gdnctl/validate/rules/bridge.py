"""HF <-> Megatron bridges: megatron-bridge's versions and what it can carry."""

from __future__ import annotations

from collections.abc import Iterator

from gdnctl.knowledge import stack, versions
from gdnctl.plan import Run
from gdnctl.validate.findings import Issue, Severity, rule


def _bridge_version(run: Run) -> str | None:
    return run.stack.get("megatron_bridge")


@rule("BRG003", Severity.ERROR, "megatron-bridge too old for the model")
def bridge_supports_model(run: Run) -> Iterator[Issue]:
    """
    What it checks: runtime.megatron_bridge has a bridge for the model class: Qwen3.5 vision-language
    checkpoints (the released ones) need >= 0.4.0, text-only Qwen3.5 classes (`Qwen3_5ForCausalLM`,
    `Qwen3_5MoeForCausalLM`) need >= 0.5.0.

    Why: older releases have no Qwen35VLBridge / Qwen35Bridge and AutoBridge fails at start-up.

    Source: megatron-bridge releases: Qwen35VLBridge / Qwen35VLMoEBridge from v0.4.0, Qwen35Bridge / Qwen35MoEBridge
    from v0.5.0 (docs/sources.md "Megatron-Bridge"; gdnctl/knowledge/model_families.py).

    Fix: upgrade megatron-bridge (0.6.2 is the pinned stack).
    """
    family = run.model.family
    needed = family.bridge_text_since if run.model.text_only else family.bridge_vision_language_since
    if not run.is_training or needed is None:
        return
    bridge = _bridge_version(run)
    if versions.below(bridge, needed):
        kind = "text-only" if run.model.text_only else "vision-language"
        yield Issue(
            "runtime.megatron_bridge",
            f"megatron-bridge {bridge} has no bridge for the {kind} {run.model.architecture} (needs >= {needed}).",
            f"Upgrade megatron-bridge to >= {needed}.",
        )


@rule("BRG004", Severity.ERROR, "MTP with sequence or context parallel on an old megatron-bridge")
def bridge_mtp_parallel(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.mtp with sequence parallel needs megatron-bridge >= 0.5.0 (shadow-embedding
    bug, PR #3143), and with cp > 1 needs >= 0.6.0 (MTP + CP shape fix).

    Why: the MTP layer's embedding and shapes are wrong under SP/CP on older bridges.

    Source: Megatron-Bridge PR #3143 (MTP shadow embedding under sequence parallel, fixed in v0.5.0) and the MTP +
    CP shape fix of v0.6.0 (docs/sources.md "Megatron-Bridge").

    Fix: upgrade megatron-bridge, or set train.mtp: false.
    """
    if not (run.is_training and run.preset.train.mtp):
        return
    bridge = _bridge_version(run)
    if run.sequence_parallel.value and versions.below(bridge, stack.BRIDGE_MTP_SEQUENCE_PARALLEL_FIX):
        yield Issue(
            "train.mtp",
            f"MTP with sequence parallel hits the shadow-embedding bug of megatron-bridge "
            f"{bridge} (fixed in {stack.BRIDGE_MTP_SEQUENCE_PARALLEL_FIX}).",
            f"Upgrade megatron-bridge to >= {stack.BRIDGE_MTP_SEQUENCE_PARALLEL_FIX}, or set train.mtp: false.",
        )
    if run.preset.parallel.cp > 1 and versions.below(bridge, stack.BRIDGE_MTP_CONTEXT_PARALLEL_FIX):
        yield Issue(
            "train.mtp",
            f"MTP with context parallel has wrong shapes on megatron-bridge {bridge} "
            f"(fixed in {stack.BRIDGE_MTP_CONTEXT_PARALLEL_FIX}).",
            f"Upgrade megatron-bridge to >= {stack.BRIDGE_MTP_CONTEXT_PARALLEL_FIX}, or set train.mtp: false.",
        )


@rule("BRG005", Severity.ERROR, "Virtual pipeline with tied embeddings under megatron-bridge")
def vpp_tied_embeddings(run: Run) -> Iterator[Issue]:
    """
    What it checks: parallel.vpp on a model with tied input/output embeddings (Qwen3.5-0.8B, 2B, 4B)
    under megatron-bridge.

    Why: megatron-bridge's `_broadcast_shared_embeddings` does not support VPP with tied embeddings.

    Source: megatron-bridge's `_broadcast_shared_embeddings` (VPP + tied embeddings unsupported: docs/sources.md
    "Megatron-Bridge").

    Fix: remove parallel.vpp (use plain pp), or pick an untied model size.
    """
    p = run.preset.parallel
    if run.is_training and p.vpp is not None and run.model.tie_word_embeddings:
        yield Issue(
            "parallel.vpp",
            f"{run.model.label} ties its embeddings, which megatron-bridge cannot "
            "broadcast across virtual pipeline stages.",
            "Remove parallel.vpp.",
        )


@rule("BRG006", Severity.WARNING, "megatron-bridge and megatron-core releases do not match")
def bridge_core_pairing(run: Run) -> Iterator[Issue]:
    """
    What it checks: the megatron-bridge minor release is paired with the megatron-core it was built for
    (bridge 0.4 -> core 0.17, 0.5 -> 0.18, 0.6 -> 0.19).

    Why: each bridge release pins one megatron-core; a mismatch imports but fails on renamed internals
    (0.19 moved GDN into a package).

    Source: megatron-bridge release pins (docs/sources.md "Megatron-Bridge"; gdnctl/knowledge/stack.py
    BRIDGE_CORE_PAIRING); the 0.19 GDN package move (docs/sources.md "Megatron-Core").

    Fix: install the megatron-core release that matches the bridge.
    """
    if not (run.is_training):
        return
    bridge, mcore = _bridge_version(run), run.stack.get("megatron_core")
    if bridge is None or mcore is None:
        return
    expected = stack.BRIDGE_CORE_PAIRING.get(versions.minor(bridge))
    if expected is not None and versions.minor(mcore) != expected:
        yield Issue(
            "runtime.megatron_core",
            f"megatron-bridge {bridge} is built for megatron-core {expected}.x, but the runtime has {mcore}.",
            f"Use megatron-core {expected}.x with megatron-bridge {versions.minor(bridge)}.x.",
        )
