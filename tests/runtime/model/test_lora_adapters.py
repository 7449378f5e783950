"""LoRA adapters in HF names: Megatron's TP shards split by the weights' own rules, the `peft` layout that `peft`
loads onto transformers' Qwen3.5 classes, and the merge."""

from __future__ import annotations

import json

import pytest
import torch

from gdnctl.knowledge import lora
from gdnctl.knowledge.catalog import from_catalog
from gdnctl.runtime.model.checkpoint import hf_text_config
from gdnctl.runtime.model.hf_weights import ShardPlace, rules_for
from gdnctl.runtime.model.lora_adapters import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    Adapter,
    column_adapters,
    merge,
    merged_state,
    row_adapters,
    write_adapter,
)

TINY = from_catalog("gdnctl/tiny-qwen3.5")
TINY_MOE = from_catalog("gdnctl/tiny-qwen3.5-moe-bytes")
TINY_NEXT = from_catalog("gdnctl/tiny-qwen3-next-bytes")
RANK, ALPHA, TP = 4, 8.0, 2


def _hf_model(arch):
    """transformers' text-only class of the architecture, random weights in fp32 (so that an adapter computed
    beside the weight, as `peft` does, and one merged into it agree to rounding)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{**hf_text_config(arch), "torch_dtype": "float32"})
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _hf_state(arch) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return _hf_model(arch).state_dict()


# (Megatron linear, column-parallel): one GDN layer (0) and one gated-attention layer (3) of the tiny models.
LINEARS = [
    ("decoder.layers.0.self_attention.in_proj.weight", True),
    ("decoder.layers.0.self_attention.out_proj.weight", False),
    ("decoder.layers.3.self_attention.linear_qkv.weight", True),
    ("decoder.layers.3.self_attention.linear_proj.weight", False),
    ("decoder.layers.0.mlp.linear_fc1.weight", True),
    ("decoder.layers.0.mlp.linear_fc2.weight", False),
]


@pytest.mark.parametrize("arch", [TINY, TINY_NEXT], ids=["qwen3.5", "qwen3-next"])
@pytest.mark.parametrize("linear,column", LINEARS, ids=[name.split(".", 3)[3] for name, _ in LINEARS])
def test_hf_adapters_merge_into_what_the_megatron_adapter_merges_into(arch, linear, column):
    """Merging each TP rank's adapter into its shard and converting to HF gives the HF weights with the HF
    adapters merged: the split of A and B follows the weights' own rules, fused weights included."""
    if "mlp.linear" in linear and arch.is_moe:
        linear = linear.replace("mlp.", "mlp.shared_experts.")
    assert arch.layer_is_gdn(0) and not arch.layer_is_gdn(3)
    rule = rules_for(arch, [linear], ShardPlace(tp_size=TP))[linear]
    torch.manual_seed(1)
    hf = {
        name: torch.randn(*tensor.shape, dtype=torch.float64)
        for name, tensor in _hf_state(arch).items()
        if name in rule.hf_names
    }
    shards = [rule.to_local(hf, rank, TP) for rank in range(TP)]
    scale = ALPHA / RANK
    if column:
        a = torch.randn(RANK, shards[0].shape[1], dtype=torch.float64)
        b_shards = [torch.randn(shard.shape[0], RANK, dtype=torch.float64) for shard in shards]
        megatron = [shard + scale * b @ a for shard, b in zip(shards, b_shards, strict=True)]
        adapters = column_adapters(rule, a, b_shards)
    else:
        b = torch.randn(shards[0].shape[0], RANK, dtype=torch.float64)
        a_shards = [torch.randn(RANK, shard.shape[1], dtype=torch.float64) for shard in shards]
        megatron = [shard + scale * b @ a for shard, a in zip(shards, a_shards, strict=True)]
        adapters = row_adapters(rule, a_shards, b)
    expected = rule.to_hf(megatron)
    assert set(adapters) == set(rule.hf_names)
    merged = {name: hf[name].double() + scale * adapter.b @ adapter.a for name, adapter in adapters.items()}
    for name in rule.hf_names:
        torch.testing.assert_close(merged[name], expected[name])


def test_merge_is_base_plus_alpha_over_rank_b_a():
    base = torch.randn(6, 5, dtype=torch.bfloat16)
    adapter = Adapter(torch.randn(2, 5), torch.randn(6, 2))
    merged = merge(base, adapter, alpha=3.0)
    assert merged.dtype == torch.bfloat16
    torch.testing.assert_close(merged, (base.float() + 1.5 * adapter.b @ adapter.a).bfloat16())
    experts = Adapter(torch.randn(3, 2, 5), torch.randn(3, 6, 2))
    stacked = torch.randn(3, 6, 5)
    torch.testing.assert_close(merge(stacked, experts, alpha=2.0), stacked + torch.bmm(experts.b, experts.a))


def test_mismatched_shapes_are_refused_with_both_shapes():
    with pytest.raises(ValueError, match=r"A \(rank x in\) and B \(out x rank\).*\(2, 5\).*\(6, 3\)"):
        Adapter(torch.zeros(2, 5), torch.zeros(6, 3))
    with pytest.raises(ValueError, match=r"\(6, 5\).*\(4, 5\)"):
        merge(torch.zeros(4, 5), Adapter(torch.zeros(2, 5), torch.zeros(6, 2)), alpha=1.0)
    with pytest.raises(KeyError, match="model.layers.9.self_attn.q_proj.weight"):
        merged_state(
            {}, {"model.layers.9.self_attn.q_proj.weight": Adapter(torch.zeros(1, 2), torch.zeros(2, 1))}, alpha=1.0
        )


def _random_adapters(arch, state: dict[str, torch.Tensor], targets) -> dict[str, Adapter]:
    """Every HF weight the targets name in `state`, each with a random adapter (B nonzero, so each shows)."""
    out = {}
    for target in targets:
        spec = lora.TARGETS[target]
        for name, tensor in state.items():
            module = name.removesuffix(".weight")
            hits_module = name.endswith(".weight") and module.rsplit(".", 1)[-1] in lora.hf_modules(arch, target)
            if target == "shared_expert":
                hits_module = hits_module and ".shared_expert." in name
            elif target == "mlp":
                hits_module = hits_module and ".mlp." in name and ".shared_expert" not in name
            if hits_module:
                out[name] = Adapter(0.1 * torch.randn(RANK, tensor.shape[1]), 0.1 * torch.randn(tensor.shape[0], RANK))
            elif any(name.endswith(f".{parameter}") for parameter in spec.hf_parameters):
                experts, fan_out, fan_in = tensor.shape
                out[name] = Adapter(0.1 * torch.randn(experts, RANK, fan_in), 0.1 * torch.randn(experts, fan_out, RANK))
    return out


@pytest.mark.parametrize("arch", [TINY, TINY_MOE, TINY_NEXT], ids=["dense", "moe", "qwen3-next"])
def test_peft_loads_the_written_adapter_and_gives_the_merged_models_logits(arch, tmp_path):
    import peft

    torch.manual_seed(0)
    base = _hf_model(arch)
    state = base.state_dict()
    # peft cannot load a Qwen3-Next shared expert's adapter (TRN019): the other targets are checked there.
    fused = arch.family.peft_fuses_shared_expert_adapter
    targets = [name for name in lora.TARGETS if lora.has_target(arch, name) and not (fused and name == "shared_expert")]
    adapters = _random_adapters(arch, state, targets)
    # Every target names weights the transformers class has, in every layer of its kind.
    for target in targets:
        modules, parameters = lora.hf_modules(arch, target), lora.TARGETS[target].hf_parameters
        layers = {
            name.split(".")[2]
            for name in adapters
            if name.rsplit(".", 2)[-2] in modules or any(name.endswith(p) for p in parameters)
        }
        assert len(layers) == lora.layers_of(arch, lora.TARGETS[target].layers), target
    write_adapter(tmp_path, adapters, alpha=ALPHA, dropout=0.05, durable=False)

    merged = _hf_model(arch)
    merged.load_state_dict(merged_state(state, adapters, ALPHA))
    adapted = peft.PeftModel.from_pretrained(base, tmp_path).eval()
    tokens = torch.randint(0, arch.vocab_size, (2, 12))
    with torch.no_grad():
        plain = _hf_model(arch)
        plain.load_state_dict(state)
        base_logits = plain(tokens).logits
        want = merged(tokens).logits
        got = adapted(tokens).logits
    assert (want - base_logits).abs().max() > 1e-2  # the adapters change the model
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    written = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert written["r"] == RANK and written["lora_alpha"] == ALPHA
    assert (tmp_path / WEIGHTS_FILE).stat().st_size > 0
    if arch.is_moe:
        assert written["target_parameters"] == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
        assert written["lora_dropout"] == 0.0
    else:
        assert written["lora_dropout"] == 0.05


def test_one_checkpoint_holds_one_rank(tmp_path):
    adapters = {
        "m.a.weight": Adapter(torch.zeros(2, 3), torch.zeros(3, 2)),
        "m.b.weight": Adapter(torch.zeros(4, 3), torch.zeros(3, 4)),
    }
    with pytest.raises(ValueError, match=r"share one rank; got ranks \[2, 4\]"):
        write_adapter(tmp_path, adapters, alpha=1.0, durable=False)


def test_peft_cannot_load_a_qwen3_next_shared_expert_adapter(tmp_path):
    """What TRN019 warns of: peft converts Qwen3-Next's gate_proj / up_proj / down_proj targets to the routed
    experts' fused parameters, so the shared expert's adapter stops the load. When this test fails, peft loads it:
    retire TRN019."""
    import peft

    torch.manual_seed(0)
    base = _hf_model(TINY_NEXT)
    adapters = _random_adapters(TINY_NEXT, base.state_dict(), ["shared_expert", "experts"])
    write_adapter(tmp_path, adapters, alpha=ALPHA, durable=False)
    with pytest.raises(RuntimeError, match="size mismatch for .*mlp.experts"):
        peft.PeftModel.from_pretrained(base, tmp_path)
