"""LoRA planning: what each readable target wraps (megatron-bridge's matching, HF names), the default targets, the
adapter parameter count and the memory estimate of a frozen base with adapters."""

from __future__ import annotations

import pytest

from gdnctl.knowledge import catalog, lora
from gdnctl.plan import explain, memory
from tests.validate.helpers import codes, run_of

DENSE = catalog.from_catalog("Qwen/Qwen3.5-9B")
MOE = catalog.from_catalog("Qwen/Qwen3.5-35B-A3B")


def _megatron_linears(arch) -> dict[str, list[str]]:
    """Every linear megatron-bridge could wrap in the megatron-bridge builder's model, under DDP's `module.` prefix,
    by the target that should wrap it (None: no target)."""
    out: dict[str, list[str]] = {}
    for index in range(arch.num_layers):
        layer = f"module.decoder.layers.{index}"
        if arch.layer_is_gdn(index):
            out.setdefault("gdn_in", []).append(f"{layer}.self_attention.in_proj")
            out.setdefault("gdn_out", []).append(f"{layer}.self_attention.out_proj")
        else:
            out.setdefault("attention_qkv", []).append(f"{layer}.self_attention.linear_qkv")
            out.setdefault("attention_out", []).append(f"{layer}.self_attention.linear_proj")
        if arch.is_moe:
            out.setdefault("experts", []).extend(f"{layer}.mlp.experts.linear_fc{i}" for i in (1, 2))
            out.setdefault("shared_expert", []).extend(f"{layer}.mlp.shared_experts.linear_fc{i}" for i in (1, 2))
            out.setdefault("", []).append(f"{layer}.mlp.router")
        else:
            out.setdefault("mlp", []).extend(f"{layer}.mlp.linear_fc{i}" for i in (1, 2))
    out.setdefault("", []).extend(["module.output_layer", "module.embedding.word_embeddings"])
    return out


@pytest.mark.parametrize("arch", [DENSE, MOE], ids=["dense", "moe"])
def test_each_target_matches_exactly_its_linears(arch):
    linears = _megatron_linears(arch)
    every = [name for names in linears.values() for name in names]
    for target in lora.TARGETS:
        patterns = lora.megatron_target_modules((target,))
        matched = sorted(name for name in every if any(lora.wildcard_match(p, name) for p in patterns))
        assert matched == sorted(linears.get(target, [])), target


@pytest.mark.parametrize("arch", [DENSE, MOE], ids=["dense", "moe"])
def test_the_default_covers_what_loras_default_names_match(arch):
    """LoRA()'s default target_modules match by the module's own name (module_matcher.py `name == pattern`)."""
    linears = _megatron_linears(arch)
    bare = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}
    covered = {
        target for target, names in linears.items() if target and any(n.rsplit(".", 1)[1] in bare for n in names)
    }
    assert set(lora.default_targets(arch)) == covered


def test_adapter_count_is_rank_times_in_plus_out_of_each_linear():
    rank = 8
    # Qwen3.5-9B: 8 gated-attention layers, 24 GDN layers, hidden 4096, dense MLP 12288.
    qkv = rank * (4096 + 2 * 16 * 256 + 2 * 4 * 256) * 8
    attention_out = rank * (16 * 256 + 4096) * 8
    gdn_in = rank * (4096 + 2 * 16 * 128 + 2 * 32 * 128 + 2 * 32) * 24
    gdn_out = rank * (32 * 128 + 4096) * 24
    mlp = rank * ((4096 + 2 * 12288) + (12288 + 4096)) * 32
    every = ("attention_qkv", "attention_out", "gdn_in", "gdn_out", "mlp")
    assert lora.adapter_params(DENSE, every, rank) == qkv + attention_out + gdn_in + gdn_out + mlp == 17_707_008
    # Qwen3.5-35B-A3B: 256 experts of width 512, each its own adapter, in all 40 layers.
    experts = rank * ((2048 + 2 * 512) + (512 + 2048)) * 256 * 40
    assert memory.count_lora_params(MOE, ("experts",), rank) == memory.LoraCount(dense=0, experts=experts)
    assert experts == 461_373_440


def test_a_target_the_model_lacks_counts_nothing():
    assert lora.adapter_params(DENSE, ("experts", "shared_expert"), 8) == 0
    assert lora.adapter_params(MOE, ("mlp",), 8) == 0


def _rows(run) -> dict[str, float]:
    return {row.name: row.gib for row in memory.estimate_training(run).rows}


def test_lora_memory_is_a_frozen_base_plus_trained_adapters():
    targets = ["attention_qkv", "attention_out", "gdn_in", "gdn_out", "mlp"]
    full = run_of({}, base="qwen3.5-9b-sft")
    adapted = run_of({"train": {"lora": {"rank": 8, "alpha": 16, "targets": targets}}}, base="qwen3.5-9b-sft")
    p = adapted.preset.parallel
    per_gpu = 17_707_008 / (p.tp * p.pp)
    grad_bytes = 2 if adapted.speed["grad_reduce"].value == "bf16" else 4
    full_rows, rows = _rows(full), _rows(adapted)
    assert rows["weights"] == pytest.approx(full_rows["weights"] + 2 * per_gpu / memory.GIB)
    assert rows["gradients"] == pytest.approx(grad_bytes * per_gpu / memory.GIB)
    assert rows["optimizer"] == pytest.approx(12 * per_gpu / (adapted.dp * p.cp) / memory.GIB)
    assert rows["activations"] == full_rows["activations"]


def test_expert_adapters_split_over_the_expert_parallel_ranks():
    lora_spec = {"rank": 8, "alpha": 16, "targets": ["experts"], "expert_adapters": "per_expert"}
    run = run_of({"train": {"lora": lora_spec, "optimizer_cpu_offload": False}})
    p = run.preset.parallel
    per_gpu = 461_373_440 / (p.ep * p.etp * p.pp)
    expert_dp = run.world_size.value // (p.ep * p.etp * p.pp)
    assert _rows(run)["optimizer"] == pytest.approx(12 * per_gpu / expert_dp / memory.GIB)


def test_shared_expert_adapters_are_one_per_layer_whole_on_every_expert_parallel_rank():
    rank = 8
    shared = rank * ((2048 + 2 * 512) + (512 + 2048)) * 40  # one adapter for a layer's 256 experts
    assert memory.count_lora_params(MOE, ("experts",), rank, shared_experts=True) == memory.LoraCount(
        dense=0, experts=shared, shared=True
    )
    lora_spec = {"rank": rank, "alpha": 16, "targets": ["experts"], "expert_adapters": "shared"}
    run = run_of({"train": {"lora": lora_spec, "optimizer_cpu_offload": False}})
    p = run.preset.parallel
    per_gpu = shared / (p.etp * p.pp)  # not split over ep: each EP rank holds the whole shared adapter
    expert_dp = run.world_size.value // (p.ep * p.etp * p.pp)
    assert _rows(run)["optimizer"] == pytest.approx(12 * per_gpu / expert_dp / memory.GIB)
    shown = {d.name: d for d in explain.derived_values(run)}
    assert shown["lora.adapter_params"].value == f"{shared:,}"
    assert "one shared by each layer's routed experts" in shown["lora.adapter_params"].reason


def test_the_engine_config_asks_megatron_bridge_for_the_expert_adapters_the_preset_names():
    from gdnctl.plan.compile import _lora

    per_expert = _lora(run_of({"train": {"lora": {"rank": 8, "alpha": 16, "expert_adapters": "per_expert"}}}))
    shared = _lora(run_of({"train": {"lora": {"rank": 8, "alpha": 16, "expert_adapters": "shared"}}}))
    assert per_expert is not None and shared is not None
    assert (per_expert.share_expert_adapters, shared.share_expert_adapters) == (False, True)


def test_auto_shares_the_expert_adapters_on_one_expert_parallel_rank_and_gives_each_expert_its_own_beyond():
    from gdnctl.plan.compile import _lora

    one_rank = run_of({"train": {"lora": {"rank": 8, "alpha": 16}}, "parallel": {"ep": 1}})
    eight_ranks = run_of({"train": {"lora": {"rank": 8, "alpha": 16}}, "parallel": {"ep": 8}})
    assert one_rank.lora_expert_adapters.value == "shared"
    assert eight_ranks.lora_expert_adapters.value == "per_expert"
    assert "TRN024" in eight_ranks.lora_expert_adapters.reason
    engine_one, engine_eight = _lora(one_rank), _lora(eight_ranks)
    assert engine_one is not None and engine_eight is not None
    assert (engine_one.share_expert_adapters, engine_eight.share_expert_adapters) == (True, False)
    shown = {d.name: d for d in explain.derived_values(one_rank)}
    assert shown["lora.expert_adapters"].value == "shared"
    assert "megatron-bridge's own default" in shown["lora.expert_adapters"].reason
    assert "one shared by each layer's routed experts" in shown["lora.adapter_params"].reason
    set_by_hand = run_of(
        {"train": {"lora": {"rank": 8, "alpha": 16, "expert_adapters": "per_expert"}}, "parallel": {"ep": 1}}
    )
    assert set_by_hand.lora_expert_adapters.value == "per_expert"
    assert set_by_hand.lora_expert_adapters.reason == "set in the preset (train.lora.expert_adapters: per_expert)"


def test_explain_names_no_expert_adapters_for_a_model_without_routed_experts():
    run = run_of({"train": {"lora": {"rank": 8, "alpha": 16}}}, base="qwen3.5-9b-sft")
    shown = {d.name: d for d in explain.derived_values(run)}
    assert "lora.expert_adapters" not in shown
    assert "experts" not in shown["lora.adapter_params"].reason


def test_explain_shows_the_targets_and_the_adapter_count():
    run = run_of({"train": {"lora": {"rank": 8, "alpha": 16}}})
    shown = {d.name: d for d in explain.derived_values(run)}
    assert shown["lora.targets"].value == ["attention_qkv", "attention_out", "shared_expert", "experts"]
    assert "megatron-bridge's Qwen3.5 LoRA recipes" in shown["lora.targets"].reason
    expected = memory.count_lora_params(run.model, tuple(shown["lora.targets"].value), 8).total
    assert shown["lora.adapter_params"].value == f"{expected:,}"
    assert "alpha / rank = 2" in shown["lora.adapter_params"].reason
    assert shown["lora.checkpoints"].value.endswith("the merged model at the last")


def test_a_dense_model_refuses_the_expert_targets_by_position():
    found = codes(
        {"train": {"lora": {"rank": 8, "alpha": 16, "targets": ["gdn_in", "experts", "shared_expert"]}}},
        base="qwen3.5-9b-sft",
    )
    assert [issue.path for issue in found["TRN017"]] == ["train.lora.targets[1]", "train.lora.targets[2]"]
    assert "dense model" in found["TRN017"][0].message


def test_the_schema_takes_each_target_once_and_a_dropout_below_one():
    from pydantic import ValidationError

    from gdnctl.schema.preset import LoraSpec

    spec = LoraSpec(rank=8, alpha=16)
    assert (spec.dropout, spec.targets, spec.expert_adapters) == (0.0, None, "auto")
    with pytest.raises(ValidationError, match="each target may appear once"):
        LoraSpec(rank=8, alpha=16, targets=["mlp", "mlp"])
    with pytest.raises(ValidationError, match="less than 1"):
        LoraSpec(rank=8, alpha=16, dropout=1.0)
    with pytest.raises(ValidationError, match="at least 1 item"):
        LoraSpec(rank=8, alpha=16, targets=[])
