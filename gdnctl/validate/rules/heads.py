"""Head-count constraints of tensor and context parallelism on attention and GDN layers."""

from __future__ import annotations

from collections.abc import Iterator

from gdnctl.knowledge import stack, versions
from gdnctl.plan import Run
from gdnctl.validate.findings import Issue, Severity, rule


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@rule("HEAD001", Severity.ERROR, "TP divides the attention heads")
def tp_divides_attention_heads(run: Run) -> Iterator[Issue]:
    """
    What it checks: parallel.tp divides the full-attention query heads.

    Why: Megatron-Core shards attention heads evenly across TP ranks.

    Source: Megatron-Core's own check: megatron/core/transformer/transformer_config.py
    TransformerConfig.__post_init__ ("num_attention_heads .. must be a multiple of tensor_model_parallel_size",
    megatron-core 0.16.1); docs/sources.md "Megatron-Core".

    Fix: pick a tp from the divisors of the head count.
    """
    heads = run.model.num_attention_heads
    tp = run.preset.parallel.tp
    if heads % tp:
        yield Issue(
            "parallel.tp",
            f"tp={tp} does not divide the {heads} attention heads of {run.model.label}.",
            f"Use tp in {{{_divisors(heads)}}}.",
        )


@rule("HEAD002", Severity.ERROR, "TP divides the KV heads, or is a multiple of them where the stack takes it")
def tp_divides_kv_heads(run: Run) -> Iterator[Issue]:
    """
    What it checks: parallel.tp divides the KV heads (`num_key_value_heads`, Megatron's query groups), or is a
    multiple of them on a stack that builds that: megatron-core >= 0.16 and, for the megatron-bridge builder on
    Qwen3.5, megatron-bridge >= 0.5.

    Why: a TP that is neither a multiple nor a divisor is refused by Megatron-Core itself (`num_query_groups (..)
    must be a multiple or divisor of tensor_model_parallel_size`). A multiple is taken since megatron-core 0.16
    (Megatron-LM PR #2565): SelfAttention all-gathers the QKV activations over TP and each rank takes its KV head
    and its share of the query heads, and it hands Transformer Engine's attention a config with one group per
    rank; megatron-core 0.15 refused it ("must be a multiple of tensor_model_parallel_size", ms-swift #8219).
    megatron-bridge 0.4.0 and 0.4.1 refuse it in their Qwen3.5 providers (`validate_parallelism`: "TP size ..
    should be less than or equal to num_query_groups"; verl #6681: Qwen3.5-35B-A3B at TP 4); Megatron-Bridge
    PR #3238 removed the guard, and 0.5.0 and 0.6.2 do not have it (0.6.2's param_mapping.py shards such a layout
    as replicated copies of the KV heads). slime PR #1662's "Megatron needs num_query_groups %
    tensor_model_parallel_size == 0" (35B-A3B from TP 4 to TP 2) describes its own stack; the versions above
    build it. The rollout's vLLM replicates KV heads over its own TP (RLT rules), whatever the trainer's TP.

    Run: tests/gpu/test_tp_above_kv_heads_gpu.py builds tiny Qwen3.5 (2 KV heads) at TP 4 through both builders
    and tiny Qwen3-Next (1 KV head) at TP 2 through megatron-bridge (megatron-core 0.19.2, TE 2.20.2,
    megatron-bridge 0.6.2), writes the HF checkpoint over TP, matches transformers' logits, reloads it and runs a
    backward pass (benchmarks/results/trains-right-2026-11-24.md).

    Where it was read: megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__: lines
    939-946 of megatron-core 0.16.1 (TP 4 and 8 over 2 query groups construct on CPU:
    tests/runtime/model/test_config_agreement.py) and lines 1338-1345 of 0.19.2, with
    megatron/core/transformer/attention.py (0.19.2 lines 353-381 and 1838-1859, 0.16.1 lines 289-301: the gather,
    the slice and the config handed to TE); megatron-bridge 0.4.1 wheel megatron/bridge/models/qwen_vl/
    qwen35_vl_provider.py lines 194-198 (dense) and 375-379 (MoE), the same in 0.4.0; megatron-bridge 0.6.2
    megatron/bridge/models/conversion/param_mapping.py `_get_shard_spec` (lines 533-576).

    Source: megatron/core/transformer/transformer_config.py and attention.py (megatron-core 0.16.1, 0.19.2);
    megatron-bridge 0.4.0/0.4.1 qwen_vl/qwen35_vl_provider.py and 0.6.2 conversion/param_mapping.py;
    verl-project/verl #6681; NVIDIA-NeMo/Megatron-Bridge PR #3238; modelscope/ms-swift #8219 and PR #8253;
    THUDM/slime PR #1662; the GPU run above.

    Fix: a TP that divides the KV heads or is a multiple of them; for a multiple, megatron-core >= 0.16 (and
    megatron-bridge >= 0.5 for Qwen3.5 through the bridge).
    """
    kv = run.model.num_key_value_heads
    tp = run.preset.parallel.tp
    if kv % tp == 0:
        return
    model = run.model.label
    if tp % kv:
        yield Issue(
            "parallel.tp",
            f"tp={tp} is neither a divisor nor a multiple of the {kv} KV heads of {model}: "
            "Megatron-Core refuses it (the query groups must be a multiple or a divisor "
            "of the TP size).",
            f"Use tp in {{{_divisors(kv)}}} or a multiple of {kv} that divides the attention heads.",
        )
        return
    mcore = run.stack.get("megatron_core")
    if versions.below(mcore, stack.MCORE_KV_HEAD_REPLICATION):
        yield Issue(
            "parallel.tp",
            f"tp={tp} is above the {kv} KV heads of {model}, and megatron-core {mcore} "
            "refuses that (it takes only a TP that divides the query groups; "
            f"{stack.MCORE_KV_HEAD_REPLICATION} replicates KV heads over TP).",
            f"Use tp in {{{_divisors(kv)}}}, or megatron-core >= {stack.MCORE_KV_HEAD_REPLICATION} "
            "(runtime.megatron_core).",
        )
        return
    bridge = run.stack.get("megatron_bridge")
    family = run.model.family
    since = family.bridge_tp_above_kv_heads_since
    if run.model_builder.value == "megatron-bridge" and since is not None and versions.below(bridge, since):
        yield Issue(
            "parallel.tp",
            f"tp={tp} is above the {kv} KV heads of {model}, and megatron-bridge {bridge}'s "
            f'{family.label} provider refuses that ("TP size should be less than or equal to '
            'num_query_groups"; Megatron-Core itself takes it).',
            f"Use tp in {{{_divisors(kv)}}}, or megatron-bridge >= {since} (runtime.megatron_bridge).",
        )


@rule("HEAD003", Severity.ERROR, "TP x CP divides the GDN key heads")
def tp_cp_divide_gdn_key_heads(run: Run) -> Iterator[Issue]:
    """
    What it checks: tp x cp divides `linear_num_key_heads`.

    Why: Megatron-Core's GDN shards heads over TP and, for context parallel, re-shards sequence to heads
    with an all-to-all over CP, so every TP x CP rank needs whole key heads (0.18+ asserts it).

    Source: Megatron-Core's GDN head constraints (docs/sources.md "Megatron-Core": `linear_num_key_heads % (TP*CP)
    == 0` from 0.18); megatron/core/transformer/transformer_config.py asserts the TP part in megatron-core 0.16.1.

    Fix: lower tp or cp (Qwen3.5 has 16 GDN key heads).
    """
    p = run.preset.parallel
    heads = run.model.linear_num_key_heads
    if heads % (p.tp * p.cp):
        yield Issue(
            "parallel.cp" if p.cp > 1 else "parallel.tp",
            f"tp x cp = {p.tp} x {p.cp} does not divide the {heads} GDN key heads of {run.model.label}.",
            f"Choose tp and cp whose product divides {heads}.",
        )


@rule("HEAD004", Severity.ERROR, "TP x CP divides the GDN value heads")
def tp_cp_divide_gdn_value_heads(run: Run) -> Iterator[Issue]:
    """
    What it checks: tp x cp divides `linear_num_value_heads`.

    Why: as HEAD003, for value heads (0.18+ asserts `linear_num_value_heads % (TP*CP) == 0`).

    Source: Megatron-Core's GDN head constraints (docs/sources.md "Megatron-Core": `linear_num_value_heads % (TP*CP)
    == 0` from 0.18); megatron/core/transformer/transformer_config.py asserts the TP part in megatron-core 0.16.1.

    Fix: lower tp or cp.
    """
    p = run.preset.parallel
    heads = run.model.linear_num_value_heads
    if heads % (p.tp * p.cp):
        yield Issue(
            "parallel.cp" if p.cp > 1 else "parallel.tp",
            f"tp x cp = {p.tp} x {p.cp} does not divide the {heads} GDN value heads of {run.model.label}.",
            f"Choose tp and cp whose product divides {heads}.",
        )


@rule("HEAD005", Severity.ERROR, "GDN value heads are a multiple of key heads")
def value_heads_multiple_of_key_heads(run: Run) -> Iterator[Issue]:
    """
    What it checks: `linear_num_value_heads % linear_num_key_heads == 0` (grouped value attention).

    Why: Megatron-Core and the kernels repeat each key head over a whole group of value heads.

    Source: megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__ ("linear_num_value_heads
    .. must be a multiple of linear_num_key_heads", megatron-core 0.16.1); docs/sources.md "Megatron-Core".

    Fix: the checkpoint's config.json is inconsistent; check model.path.
    """
    m = run.model
    if m.linear_num_value_heads % m.linear_num_key_heads:
        yield Issue(
            "model",
            f"{m.label} has {m.linear_num_value_heads} GDN value heads, not a multiple of its "
            f"{m.linear_num_key_heads} key heads.",
            "Check the checkpoint's config.json (linear_num_value_heads, linear_num_key_heads).",
        )
