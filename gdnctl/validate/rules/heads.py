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

    Why: Megatron-Core asserts `num_query_groups % tensor_model_parallel_size == 0`; it does not replicate
    KV heads. Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B and Qwen3-Next-80B have 2 KV heads, so TP <= 2
    (slime PR #1662 moved 35B-A3B from TP4 to TP2; AReaL tests the same).

    Fix: use tp 1 or 2 on 2-KV-head models and scale with ep, cp, pp or dp instead.
    """
    kv = run.model.num_key_value_heads
    tp = run.preset.parallel.tp
    if kv % tp:
        yield Issue("parallel.tp", f"tp={tp} does not divide the {kv} KV heads of {run.model.label}: this model "
                                   f"has {kv} KV heads, so TP <= {kv} (TP must divide {kv}).",
                    f"Use tp in {{{_divisors(kv)}}}; scale with ep/cp/pp/dp instead.")


@rule("HEAD003", Severity.ERROR, "TP x CP divides the GDN key heads")
def tp_cp_divide_gdn_key_heads(run):
    """
    What it checks: tp x cp divides `linear_num_key_heads`.

    Why: Megatron-Core's GDN shards heads over TP and, for context parallel, re-shards sequence to heads
    with an all-to-all over CP, so every TP x CP rank needs whole key heads (0.18+ asserts it).

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

    Fix: the checkpoint's config.json is inconsistent; check model.path.
    """
    m = run.model
    if m.linear_num_value_heads % m.linear_num_key_heads:
        yield Issue("model", f"{m.label} has {m.linear_num_value_heads} GDN value heads, not a multiple of its "
                             f"{m.linear_num_key_heads} key heads.",
                    "Check the checkpoint's config.json (linear_num_value_heads, linear_num_key_heads).")
