"""Sequence layout (packed THD vs padded BSHD) and GDN context parallel, by Megatron-Core version."""

from __future__ import annotations

from collections.abc import Iterator

from gdnctl.knowledge import stack, versions
from gdnctl.plan import Run
from gdnctl.validate.findings import Issue, Severity, rule


def _mcore(run: Run) -> str | None:
    return run.stack.get("megatron_core")


@rule("LAY001", Severity.ERROR, "Megatron-Core has GatedDeltaNet")
def mcore_has_gdn(run: Run) -> Iterator[Issue]:
    """
    What it checks: runtime.megatron_core is at least 0.16, the first release with GatedDeltaNet.

    Why: older Megatron-Core cannot build Qwen3.5 / Qwen3-Next GDN layers (megatron/core/ssm/gated_delta_net).

    Source: megatron/core/ssm/gated_delta_net, first in megatron-core 0.16 (docs/sources.md "Megatron-Core";
    gdnctl/knowledge/stack.py MCORE_GDN).

    Fix: set runtime.megatron_core to 0.19.2 (the stack gdnctl is pinned to) and install it.
    """
    mcore = _mcore(run)
    if run.is_training and versions.below(mcore, stack.MCORE_GDN):
        yield Issue(
            "runtime.megatron_core",
            f"megatron-core {mcore} has no GatedDeltaNet (added in {stack.MCORE_GDN}).",
            "Use megatron-core >= 0.16; 0.19.2 is the pinned stack.",
        )


@rule("LAY002", Severity.ERROR, "Packed (THD) sequences need Megatron-Core >= 0.18")
def thd_needs_018(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.layout: thd is only used with megatron-core >= 0.18.

    Why: 0.16 and 0.17 raise `NotImplementedError("GDN does not support packed sequence for now.")`;
    packed sequences arrived in 0.18 (Megatron-LM PR #2645). `layout: auto` picks bshd there instead.

    Source: Megatron-LM PR #2645 (packed GDN sequences in megatron-core 0.18) and the NotImplementedError of
    0.16/0.17 (docs/sources.md "Megatron-Core").

    Fix: set train.layout: auto (or bshd), or upgrade megatron-core to >= 0.18.
    """
    mcore = _mcore(run)
    if run.is_training and run.layout.value == "thd" and versions.below(mcore, stack.MCORE_GDN_PACKED_AND_CP):
        yield Issue(
            "train.layout",
            f"layout thd needs megatron-core >= {stack.MCORE_GDN_PACKED_AND_CP}, but the "
            f"runtime is {mcore}, whose GDN rejects packed sequences.",
            "Set train.layout: auto (bshd on this version), or upgrade megatron-core.",
        )


@rule("LAY003", Severity.ERROR, "GDN context parallel needs Megatron-Core >= 0.18")
def cp_needs_018(run: Run) -> Iterator[Issue]:
    """
    What it checks: parallel.cp > 1 only with megatron-core >= 0.18.

    Why: 0.16/0.17 assert context parallel off for GDN; 0.18 added the CP <-> head-parallel all-to-all
    (Megatron-LM PR #2642).

    Source: Megatron-LM PR #2642 (GDN context parallel in megatron-core 0.18; docs/sources.md "Megatron-Core").

    Fix: set parallel.cp: 1, or upgrade megatron-core.
    """
    mcore = _mcore(run)
    cp = run.preset.parallel.cp
    if run.is_training and cp > 1 and versions.below(mcore, stack.MCORE_GDN_PACKED_AND_CP):
        yield Issue(
            "parallel.cp",
            f"cp={cp} needs megatron-core >= {stack.MCORE_GDN_PACKED_AND_CP} for GDN; the runtime is {mcore}.",
            "Set parallel.cp: 1, or upgrade megatron-core to >= 0.18.",
        )


@rule("LAY004", Severity.ERROR, "Padded (BSHD) layout cannot use context parallel")
def bshd_no_cp(run: Run) -> Iterator[Issue]:
    """
    What it checks: a bshd layout with parallel.cp > 1.

    Why: GDN context parallel works on packed sequences; AReaL's padded path raises NotImplementedError
    for CP > 1 (AReaL PR #1384).

    Source: AReaL PR #1384 (its padded path raises NotImplementedError for CP > 1; docs/sources.md "AReaL's Megatron
    path").

    Fix: use layout thd (auto on megatron-core >= 0.18) or parallel.cp: 1.
    """
    cp = run.preset.parallel.cp
    if run.is_training and run.layout.value == "bshd" and cp > 1:
        yield Issue(
            "train.layout",
            f"layout bshd ({run.layout.reason}) cannot be combined with cp={cp}.",
            "Use train.layout: thd (megatron-core >= 0.18), or parallel.cp: 1.",
        )


@rule("LAY005", Severity.WARNING, "Padded (BSHD) layout with micro batch > 1")
def bshd_micro_batch(run: Run) -> Iterator[Issue]:
    """
    What it checks: a bshd layout with train.micro_batch_size > 1, unless the rows are concatenated documents
    (train.packing: concat: full rows, none padded).

    Why: AReaL PR #1384 reports that its padded path is not micro-batch invariant: the gradient norm drifts when a
    micro-batch holds more than one row, which it puts down to where each micro-batch's padding falls (every
    micro-batch is padded to its own longest row). The padding does not enter the recurrent state: gdnctl pads on
    the right, after a row's real tokens, and a causal layer (GDN's recurrence and its short convolution alike)
    reads only earlier positions. verl's Qwen3.5 recipes train with micro-batch 1 for the same reason.

    Source: AReaL PR #1384 (the drift and its attribution to per-micro-batch padding) and verl's micro-batch 1
    (docs/sources.md "AReaL's Megatron path"); right padding: gdnctl/runtime/data/layout.py to_bshd (each row's
    tokens from column 0, the padding after them).

    Fix: set train.micro_batch_size: 1 (and raise the global batch or dp instead).
    """
    mbs = run.preset.train.micro_batch_size
    # The CPU jobs (transformers' classes: the rl policy, the image sft) pad on the right, after every real token,
    # so their causal layers never read padding into a real token's state.
    on_cpu = run.gpu.sm is None
    full_rows = run.packing.value == "concat"
    if run.is_training and run.layout.value == "bshd" and mbs > 1 and not on_cpu and not full_rows:
        yield Issue(
            "train.micro_batch_size",
            f"micro_batch_size {mbs} with the padded (bshd) layout pads each "
            "micro-batch to its longest row, and the grad norm then drifts with "
            "how rows share a micro-batch.",
            "Set train.micro_batch_size: 1.",
        )


@rule("LAY006", Severity.INFO, "Context parallel without the fused GDN all-to-all")
def cp_without_fused_a2a(run: Run) -> Iterator[Issue]:
    """
    What it checks: parallel.cp > 1 on megatron-core 0.18.x.

    Why: 0.18 runs one all-to-all per sequence and per section (qkv, alpha, beta, gate); 0.19 fuses them
    into one (Megatron-LM PR #4913: 7-10% iteration speedup on a Qwen3-Next proxy, 16K, CP=4).

    Source: Megatron-LM PR #4913 (fused all-to-all in megatron-core 0.19: 7-10% on a Qwen3-Next proxy, 16K, CP=4;
    docs/sources.md "Megatron-Core").

    Fix: upgrade megatron-core to >= 0.19 for the fused all-to-all.
    """
    mcore = _mcore(run)
    cp = run.preset.parallel.cp
    if (
        run.is_training
        and cp > 1
        and versions.at_least(mcore, stack.MCORE_GDN_PACKED_AND_CP)
        and versions.below(mcore, stack.MCORE_GDN_FUSED_CP_A2A)
    ):
        yield Issue(
            "runtime.megatron_core",
            f"megatron-core {mcore} runs one GDN all-to-all per sequence and section under context parallel.",
            "Upgrade to megatron-core >= 0.19 for the fused all-to-all (7-10% faster iterations).",
        )


@rule("LAY007", Severity.ERROR, "Packed (THD) layout packs a micro-batch into one row")
def thd_micro_batch(run: Run) -> Iterator[Issue]:
    """
    What it checks: a thd layout with train.micro_batch_size > 1.

    Why: Megatron-Core's GDN THD path needs batch size 1: a micro-batch is one packed row of
    concatenated sequences (Megatron-LM PR #2645). seq_length sets the tokens per micro-batch.

    Source: Megatron-LM PR #2645 (GDN's THD path needs batch 1; docs/sources.md "Megatron-Core").

    Fix: set train.micro_batch_size: 1 and size train.seq_length to the tokens per micro-batch.
    """
    mbs = run.preset.train.micro_batch_size
    if run.is_training and run.layout.value == "thd" and mbs > 1:
        yield Issue(
            "train.micro_batch_size",
            f"the packed (thd) layout needs micro_batch_size 1, not {mbs}.",
            "Set train.micro_batch_size: 1 and put the tokens per micro-batch in train.seq_length.",
        )


@rule("LAY009", Severity.ERROR, "Sequence length splits into 2 x cp chunks")
def seq_length_cp(run: Run) -> Iterator[Issue]:
    """
    What it checks: with cp > 1, train.seq_length is a multiple of 2 x cp.

    Why: Megatron-Core's context parallel cuts each sequence into 2 x CP chunks for causal load balancing,
    and GDN's CP all-to-all needs each sequence length divisible by CP (THD sequences are padded to it).

    Source: Megatron-Core's context parallel (megatron/core/utils.py get_batch_on_this_cp_rank: 2 x CP chunks) and
    GDN CP's "each sequence length divisible by cp" (docs/sources.md "Megatron-Core").

    Fix: round train.seq_length to a multiple of 2 x cp.
    """
    cp = run.preset.parallel.cp
    seq = run.preset.train.seq_length
    if run.is_training and cp > 1 and seq % (2 * cp):
        yield Issue(
            "train.seq_length",
            f"seq_length {seq} is not a multiple of 2 x cp = {2 * cp}.",
            f"Use a multiple of {2 * cp}, e.g. {(seq // (2 * cp) + 1) * 2 * cp}.",
        )


@rule("LAY010", Severity.WARNING, "Transformer Engine's packed attention at head_dim 256 on Hopper")
def te_packed_attention_head_dim(run: Run) -> Iterator[Issue]:
    """
    What it checks: packed (THD) training on Hopper whose full-attention layers run Transformer Engine's attention
    (parallel.cp > 1, which only TE's attention splits, or kernels.attention: te) at a head_dim above 128 (Qwen3.5
    and Qwen3-Next: 256). An error when runtime.cudnn names a cuDNN below 9.19, a warning when it is unset.

    Why: measured on an H100 (TE 2.20.2, megatron-core 0.19.2, torch 2.11; benchmarks/attention_check.py):
    TE's DotProductAttention, with no FlashAttention package, runs cuDNN's fused attention, and its THD backward at
    head_dim 256 with 16 query / 2 KV heads was wrong in every trial: dQ 15-19% off a per-sequence fp32 reference,
    dK/dV off or NaN in packed rows, while the forward and the same kernel on full rows (SBHD) were within 0.3%.
    The 35B-A3B proxy trained on it gave a NaN gradient at step 2. TE loaded the system's cuDNN 9.14, not the 9.19
    torch bundles, so torch's cuDNN version says nothing about it. With cp 1, `kernels.attention: auto` runs packed
    rows on torch's varlen FlashAttention instead (within 0.3%); context parallel has no such alternative.

    Source: gdnctl's measurement above (benchmarks/results/packed-rows-nan-h100-2026-11-25.md); NVIDIA/Megatron-LM PR
    #2644's description (Qwen3.5 and Qwen3-Next THD training on Hopper needs cuDNN >= 9.19.0; up to 9.18.0 the
    gradients go NaN) and Megatron-LM issue #5044, where a maintainer names it the SM90 varlen fused-attention gradient
    bug (docs/sources.md "Megatron-Core"). This rule replaced LAY008, which demanded cuDNN >= 9.19 for every packed run
    on Hopper, also where torch's FlashAttention, not cuDNN, runs the attention.

    Fix: run parallel.cp 1 with kernels.attention: auto (or torch), or train.layout: bshd; for context parallel,
    make Transformer Engine load cuDNN >= 9.19 and say so in runtime.cudnn, then check it with
    `python benchmarks/attention_check.py`.
    """
    if not (
        run.is_training
        and run.gpu.is_hopper
        and run.layout.value == "thd"
        and run.model_builder.value == "megatron-bridge"
        and run.attention.value == "te"
        and run.model.head_dim > 128
    ):
        return
    cudnn = run.stack.get("cudnn")
    if cudnn is not None and not versions.below(cudnn, stack.CUDNN_HOPPER_THD_MIN):
        return
    known = f"cuDNN {cudnn}" if cudnn else "an unstated cuDNN (runtime.cudnn is unset)"
    why = (
        "parallel.cp > 1 needs Transformer Engine's attention"
        if run.preset.parallel.cp > 1
        else "kernels.attention is te"
    )
    yield Issue(
        "kernels.attention" if run.preset.parallel.cp == 1 else "parallel.cp",
        f"{why}, and its packed-row backward at head_dim {run.model.head_dim} on Hopper computed wrong "
        f"gradients (NaN in training) with cuDNN 9.14; this run names {known}.",
        "Use parallel.cp: 1 with kernels.attention: auto, or train.layout: bshd; for context parallel make "
        "TE load cuDNN >= 9.19, set runtime.cudnn to it and check with benchmarks/attention_check.py.",
        severity=Severity.ERROR if cudnn else None,
    )


@rule("LAY011", Severity.ERROR, "Filled packing needs packed (THD) rows")
def fill_needs_thd(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.packing: fill with a padded (BSHD) layout.

    Why: fill cuts documents at row ends and keeps each piece its own sequence through cu_seqlens, which only the
    packed layout carries; a padded row is one sequence, so its pieces would attend to each other across documents.

    Source: gdnctl's data pipeline (runtime/data/pipeline.py DataPipeline refuses it too); Megatron-Core's padded
    path has no sequence boundaries inside a row (megatron/core/packed_seq_params.py is the only carrier).

    Fix: set train.packing: auto (whole with BSHD) or train.layout: thd.
    """
    if run.is_training and run.packing.value == "fill" and run.layout.value != "thd":
        yield Issue(
            "train.packing",
            "packing fill cuts documents into packed rows, but the layout is "
            f"{run.layout.value} (padded rows, one sequence each).",
            "Set train.packing: auto (whole) or train.layout: thd.",
        )


@rule("LAY012", Severity.WARNING, "Filled or concatenated packing cuts sft examples")
def fill_cuts_sft(run: Run) -> Iterator[Issue]:
    """
    What it checks: train.packing: fill or concat in an sft job.

    Why: both start a row in the middle of whatever document the previous row ended in, so the second piece of an
    example trains its response tokens without the prompt before them; the first piece may hold only prompt. With
    concat an example also attends to the examples before it in its row. Pretraining text loses nothing that
    matters (Megatron's GPT dataset cuts it the same way, and attends across documents unless
    `--reset-attention-mask` is set).

    Source: megatron/core/datasets/gpt_dataset.py (megatron-core 0.19.2): `_query_document_sample_shuffle_indices`
    (line 381) reads each sample as a (document, offset) start and end, built by
    helpers.build_sample_idx (line 583); gdnctl's runtime/data/pipeline.py filled_rows.

    Fix: set train.packing: auto (whole for sft), or keep fill or concat only for raw text trained like pretraining.
    """
    packing = run.preset.train.packing
    if run.is_training and run.preset.job == "sft" and packing in ("fill", "concat"):
        yield Issue(
            "train.packing",
            f"packing {packing} cuts sft examples at row ends, so a piece can train a response without its prompt"
            + (", and each example attends to the ones before it in its row." if packing == "concat" else "."),
            "Set train.packing: auto (whole), unless the data is raw text trained like pretraining.",
        )
