"""Head-count constraints of tensor and context parallelism on attention and GDN layers."""

from __future__ import annotations

from gdnctl.validate.findings import Issue, Severity, rule


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@rule("HEAD001", Severity.ERROR, "TP divides the attention heads")
def tp_divides_attention_heads(run):
    """
    What it checks: parallel.tp divides the full-attention query heads.

    Why: Megatron-Core shards attention heads evenly across TP ranks.

    Source: Megatron-Core's own check: megatron/core/transformer/transformer_config.py
    TransformerConfig.__post_init__ ("num_attention_heads .. must be a multiple of tensor_model_parallel_size",
    megatron-core 0.16.1); FACTS.md section 2.

    Fix: pick a tp from the divisors of the head count.
    """
    heads = run.model.num_attention_heads
    tp = run.preset.parallel.tp
    if heads % tp:
        yield Issue("parallel.tp", f"tp={tp} does not divide the {heads} attention heads of {run.model.label}.",
                    f"Use tp in {{{_divisors(heads)}}}.")


@rule("HEAD002", Severity.ERROR, "TP divides the KV heads (query groups)")
def tp_divides_kv_heads(run):
    """
    What it checks: parallel.tp divides the KV heads (`num_key_value_heads`, Megatron's query groups).

    Why: this is stricter than Megatron-Core. Megatron-Core >= 0.16 accepts a TP that is a multiple or a divisor
    of the query groups: with TP above the KV heads its SelfAttention all-gathers the QKV activations, and each
    rank takes its KV group and its share of the query heads (Megatron-LM PR #2565). It refuses only a TP that is
    neither (`num_query_groups (..) must be a multiple or divisor of tensor_model_parallel_size`); megatron-core
    0.15 refused everything but a divisor ("must be a multiple of tensor_model_parallel_size", ms-swift #8219),
    and LAY001 asks for >= 0.16 anyway.
    What is known to refuse a TP above the KV heads is megatron-bridge 0.4.0 and 0.4.1: their Qwen3.5 providers
    (`Qwen35VLModelProvider` and `Qwen35VLMoEModelProvider.validate_parallelism`) raise "TP size .. should be less
    than or equal to num_query_groups" (verl #6681: Qwen3.5-35B-A3B at TP 4); Megatron-Bridge PR #3238 removed the
    guard, and 0.5.0 and 0.6.2 do not have it. slime PR #1662 moved 35B-A3B from TP 4 to TP 2 stating that
    "Megatron needs num_query_groups % tensor_model_parallel_size == 0" (on slime's own Qwen3.5 stack; versions not
    given). gdnctl's trainer does not build through megatron-bridge: it builds Megatron-Core's SelfAttention and
    cuts linear_qkv evenly over TP as Megatron-Core lays it out (runtime/model/hf_weights.py), but it has not run a
    TP above the KV heads on GPUs, so this rule keeps refusing it until that run shows which component, if any,
    refuses it. Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B and Qwen3-Next-80B have 2 KV heads, so TP <= 2 here.

    Where it was read: megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__: lines
    939-946 of megatron-core 0.16.1 (TP 4 and 8 over 2 query groups construct on CPU:
    tests/runtime/model/test_config_agreement.py) and lines 1338-1345 of 0.19.2 (read in the 0.19.2 wheel), with
    megatron/core/transformer/attention.py (0.19.2 lines 353-366 and 1838-1856, 0.16.1 lines 289-301: the gather
    and the slice); megatron-bridge 0.4.1 wheel megatron/bridge/models/qwen_vl/qwen35_vl_provider.py lines 194-198
    (dense) and 375-379 (MoE), the same in 0.4.0.

    Source: megatron/core/transformer/transformer_config.py and attention.py (megatron-core 0.16.1, 0.19.2);
    megatron-bridge 0.4.0/0.4.1 qwen_vl/qwen35_vl_provider.py; verl-project/verl #6681; NVIDIA-NeMo/Megatron-Bridge
    PR #3238; modelscope/ms-swift #8219 and PR #8253; THUDM/slime PR #1662.

    Fix: use tp 1 or 2 on 2-KV-head models and scale with ep, cp, pp or dp instead.
    """
    kv = run.model.num_key_value_heads
    tp = run.preset.parallel.tp
    if kv % tp == 0:
        return
    if tp % kv == 0:
        why = ("Megatron-Core >= 0.16 accepts a TP that is a multiple of the KV heads, but megatron-bridge 0.4's "
               "Qwen3.5 providers refuse it and gdnctl's trainer has not run it on GPUs")
    else:
        why = "Megatron-Core refuses it too: the query groups must be a multiple or a divisor of the TP size"
    yield Issue("parallel.tp", f"tp={tp} does not divide the {kv} KV heads of {run.model.label}: this model has "
                               f"{kv} KV heads, so TP <= {kv} (TP must divide {kv}); {why}.",
                f"Use tp in {{{_divisors(kv)}}}; scale with ep/cp/pp/dp instead.")


@rule("HEAD003", Severity.ERROR, "TP x CP divides the GDN key heads")
def tp_cp_divide_gdn_key_heads(run):
    """
    What it checks: tp x cp divides `linear_num_key_heads`.

    Why: Megatron-Core's GDN shards heads over TP and, for context parallel, re-shards sequence to heads
    with an all-to-all over CP, so every TP x CP rank needs whole key heads (0.18+ asserts it).

    Source: Megatron-Core's GDN head constraints (FACTS.md section 2: `linear_num_key_heads % (TP*CP) == 0` from
    0.18); megatron/core/transformer/transformer_config.py asserts the TP part in megatron-core 0.16.1.

    Fix: lower tp or cp (Qwen3.5 has 16 GDN key heads).
    """
    p = run.preset.parallel
    heads = run.model.linear_num_key_heads
    if heads % (p.tp * p.cp):
        yield Issue("parallel.cp" if p.cp > 1 else "parallel.tp",
                    f"tp x cp = {p.tp} x {p.cp} does not divide the {heads} GDN key heads of {run.model.label}.",
                    f"Choose tp and cp whose product divides {heads}.")


@rule("HEAD004", Severity.ERROR, "TP x CP divides the GDN value heads")
def tp_cp_divide_gdn_value_heads(run):
    """
    What it checks: tp x cp divides `linear_num_value_heads`.

    Why: as HEAD003, for value heads (0.18+ asserts `linear_num_value_heads % (TP*CP) == 0`).

    Source: Megatron-Core's GDN head constraints (FACTS.md section 2: `linear_num_value_heads % (TP*CP) == 0` from
    0.18); megatron/core/transformer/transformer_config.py asserts the TP part in megatron-core 0.16.1.

    Fix: lower tp or cp.
    """
    p = run.preset.parallel
    heads = run.model.linear_num_value_heads
    if heads % (p.tp * p.cp):
        yield Issue("parallel.cp" if p.cp > 1 else "parallel.tp",
                    f"tp x cp = {p.tp} x {p.cp} does not divide the {heads} GDN value heads of {run.model.label}.",
                    f"Choose tp and cp whose product divides {heads}.")


@rule("HEAD005", Severity.ERROR, "GDN value heads are a multiple of key heads")
def value_heads_multiple_of_key_heads(run):
    """
    What it checks: `linear_num_value_heads % linear_num_key_heads == 0` (grouped value attention).

    Why: Megatron-Core and the kernels repeat each key head over a whole group of value heads.

    Source: megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__ ("linear_num_value_heads
    .. must be a multiple of linear_num_key_heads", megatron-core 0.16.1); FACTS.md section 2.

    Fix: the checkpoint's config.json is inconsistent; check model.path.
    """
    m = run.model
    if m.linear_num_value_heads % m.linear_num_key_heads:
        yield Issue("model", f"{m.label} has {m.linear_num_value_heads} GDN value heads, not a multiple of its "
                             f"{m.linear_num_key_heads} key heads.",
                    "Check the checkpoint's config.json (linear_num_value_heads, linear_num_key_heads).")
