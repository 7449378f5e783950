"""HF <-> Megatron-Core shard conversion, checked against how Megatron-Core 0.19 reads its own shards.

Megatron itself needs a GPU; these tests replay its slicing (GatedDeltaNet.in_proj_split_sections,
SelfAttention.get_query_key_value_tensors, SwiGLU's chunk) on the shards the converter makes, so a layout
mistake shows up as the wrong HF rows. The GPU test (tests/gpu) then compares logits with transformers.
"""

from __future__ import annotations

import pytest
import torch

from gdnctl.knowledge.catalog import from_catalog
from gdnctl.runtime.model.hf_weights import (
    ShardPlace,
    canonical_hf_name,
    group_rank_and_size,
    next_gdn_to_qwen35,
    qwen35_gdn_to_next,
    rules_for,
)

TINY = from_catalog("gdnctl/tiny-qwen3.5")
# The MoE proxy, shrunk further so random HF tensors stay small on the CPU.
PROXY = from_catalog("gdnctl/qwen3.5-35b-a3b-proxy").model_copy(
    update={"num_experts": 4, "num_layers": 4, "vocab_size": 1024, "hidden_size": 128}
)
# Qwen3-Next-80B-A3B's head layout (16 key / 32 value GDN heads, so two value heads per key head), shrunk.
NEXT = from_catalog("Qwen/Qwen3-Next-80B-A3B").model_copy(
    update={
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_layers": 4,
        "vocab_size": 512,
        "hidden_size": 64,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "head_dim": 32,
        "moe_ffn_hidden_size": 32,
        "shared_expert_ffn_hidden_size": 32,
    }
)


def megatron_names(arch) -> list[str]:
    names = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight"]
    if not arch.tie_word_embeddings:
        names.append("output_layer.weight")
    for i in range(arch.num_layers):
        layer = f"decoder.layers.{i}"
        names += [f"{layer}.input_layernorm.weight", f"{layer}.pre_mlp_layernorm.weight"]
        attn = f"{layer}.self_attention"
        if arch.layer_is_gdn(i):
            names += [
                f"{attn}.{n}"
                for n in ("in_proj.weight", "conv1d.weight", "dt_bias", "A_log", "out_norm.weight", "out_proj.weight")
            ]
        else:
            names += [
                f"{attn}.{n}"
                for n in ("linear_qkv.weight", "q_layernorm.weight", "k_layernorm.weight", "linear_proj.weight")
            ]
        if arch.is_moe:
            names.append(f"{layer}.mlp.router.weight")
            names += [
                f"{layer}.mlp.experts.local_experts.{e}.linear_fc{k}.weight"
                for e in range(arch.num_experts)
                for k in (1, 2)
            ]
            names += [
                f"{layer}.mlp.shared_experts.{n}" for n in ("linear_fc1.weight", "linear_fc2.weight", "gate_weight")
            ]
        else:
            names += [f"{layer}.mlp.linear_fc1.weight", f"{layer}.mlp.linear_fc2.weight"]
    return names


def hf_shapes(arch) -> dict[str, tuple[int, ...]]:
    h = arch.hidden_size
    key_dim = arch.linear_num_key_heads * arch.linear_key_head_dim
    value_dim = arch.linear_num_value_heads * arch.linear_value_head_dim
    shapes = {
        "model.embed_tokens.weight": (arch.vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (arch.vocab_size, h),
    }
    for i in range(arch.num_layers):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (h,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (h,)
        if arch.layer_is_gdn(i):
            a = f"{p}.linear_attn"
            if arch.family.gdn_in_projection == "per_key_head":
                shapes.update(
                    {
                        f"{a}.in_proj_qkvz.weight": (2 * key_dim + 2 * value_dim, h),
                        f"{a}.in_proj_ba.weight": (2 * arch.linear_num_value_heads, h),
                    }
                )
            else:
                shapes.update(
                    {
                        f"{a}.in_proj_qkv.weight": (2 * key_dim + value_dim, h),
                        f"{a}.in_proj_z.weight": (value_dim, h),
                        f"{a}.in_proj_b.weight": (arch.linear_num_value_heads, h),
                        f"{a}.in_proj_a.weight": (arch.linear_num_value_heads, h),
                    }
                )
            shapes.update(
                {
                    f"{a}.conv1d.weight": (2 * key_dim + value_dim, 1, arch.linear_conv_kernel_dim),
                    f"{a}.dt_bias": (arch.linear_num_value_heads,),
                    f"{a}.A_log": (arch.linear_num_value_heads,),
                    f"{a}.norm.weight": (arch.linear_value_head_dim,),
                    f"{a}.out_proj.weight": (h, value_dim),
                }
            )
        else:
            a, d = f"{p}.self_attn", arch.head_dim
            shapes.update(
                {
                    f"{a}.q_proj.weight": (2 * arch.num_attention_heads * d, h),
                    f"{a}.k_proj.weight": (arch.num_key_value_heads * d, h),
                    f"{a}.v_proj.weight": (arch.num_key_value_heads * d, h),
                    f"{a}.q_norm.weight": (d,),
                    f"{a}.k_norm.weight": (d,),
                    f"{a}.o_proj.weight": (h, arch.num_attention_heads * d),
                }
            )
        mlps = []
        if arch.is_moe:
            shapes[f"{p}.mlp.gate.weight"] = (arch.num_experts, h)
            shapes[f"{p}.mlp.shared_expert_gate.weight"] = (1, h)
            mlps += [(f"{p}.mlp.experts.{e}", arch.moe_ffn_hidden_size) for e in range(arch.num_experts)]
            mlps.append((f"{p}.mlp.shared_expert", arch.shared_expert_ffn_hidden_size))
        else:
            mlps.append((f"{p}.mlp", arch.ffn_hidden_size))
        for prefix, width in mlps:
            shapes.update(
                {
                    f"{prefix}.gate_proj.weight": (width, h),
                    f"{prefix}.up_proj.weight": (width, h),
                    f"{prefix}.down_proj.weight": (h, width),
                }
            )
    return shapes


def random_hf(arch) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=generator) for name, shape in hf_shapes(arch).items()}


def places(arch, tp: int, ep: int = 1) -> list[ShardPlace]:
    return [ShardPlace(tp_rank=t, tp_size=tp, ep_rank=e, ep_size=ep) for e in range(ep) for t in range(tp)]


@pytest.mark.parametrize("arch", [TINY, PROXY, NEXT], ids=["dense", "moe", "qwen3-next"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_every_tensor_survives_sharding_and_gathering(arch, tp):
    hf = random_hf(arch)
    rebuilt: dict[str, torch.Tensor] = {}
    ep = 2 if arch.is_moe else 1
    names = megatron_names(arch.model_copy(update={"num_experts": arch.num_experts // ep}) if arch.is_moe else arch)
    for e in range(ep):
        rules = rules_for(arch, names, ShardPlace(tp_size=tp, ep_rank=e, ep_size=ep))
        for rule in rules.values():
            shards = []
            for t in range(tp):
                place = ShardPlace(tp_rank=t, tp_size=tp, ep_rank=e, ep_size=ep)
                rank, size = group_rank_and_size(rule, place)
                shards.append(rule.to_local(hf, rank, size))
            size = group_rank_and_size(rule, ShardPlace(tp_size=tp))[1]
            rebuilt.update(rule.to_hf(shards[:size]))
    expected = {name for name in hf if not (arch.tie_word_embeddings and name == "lm_head.weight")}
    assert set(rebuilt) == expected
    for name in expected:
        assert torch.equal(rebuilt[name], hf[name]), name


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gdn_in_proj_shard_splits_the_way_megatron_reads_it(tp):
    arch, hf = TINY, random_hf(TINY)
    rule = rules_for(arch, ["decoder.layers.0.self_attention.in_proj.weight"], ShardPlace())[
        "decoder.layers.0.self_attention.in_proj.weight"
    ]
    key_dim = arch.linear_num_key_heads * arch.linear_key_head_dim
    value_dim = arch.linear_num_value_heads * arch.linear_value_head_dim
    heads = arch.linear_num_value_heads
    qkv = hf["model.layers.0.linear_attn.in_proj_qkv.weight"]
    for rank in range(tp):
        local = rule.to_local(hf, rank, tp)
        # GatedDeltaNet._setup_variant_attrs: in_proj_split_sections, local to the TP rank
        q, k, v, z, b, a = local.split(
            [key_dim // tp, key_dim // tp, value_dim // tp, value_dim // tp, heads // tp, heads // tp]
        )
        assert torch.equal(q, qkv[:key_dim].chunk(tp)[rank])
        assert torch.equal(k, qkv[key_dim : 2 * key_dim].chunk(tp)[rank])
        assert torch.equal(v, qkv[2 * key_dim :].chunk(tp)[rank])
        assert torch.equal(z, hf["model.layers.0.linear_attn.in_proj_z.weight"].chunk(tp)[rank])
        assert torch.equal(b, hf["model.layers.0.linear_attn.in_proj_b.weight"].chunk(tp)[rank])
        assert torch.equal(a, hf["model.layers.0.linear_attn.in_proj_a.weight"].chunk(tp)[rank])


@pytest.mark.parametrize("tp", [1, 2])
def test_gated_qkv_shard_splits_the_way_megatron_reads_it(tp):
    arch, hf = TINY, random_hf(TINY)
    name = "decoder.layers.3.self_attention.linear_qkv.weight"
    rule = rules_for(arch, [name], ShardPlace())[name]
    heads, groups, d = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    per_group = heads // groups
    q_proj = hf["model.layers.3.self_attn.q_proj.weight"].view(heads, 2 * d, -1)
    k_proj = hf["model.layers.3.self_attn.k_proj.weight"].view(groups, d, -1)
    v_proj = hf["model.layers.3.self_attn.v_proj.weight"].view(groups, d, -1)
    for rank in range(tp):
        local = rule.to_local(hf, rank, tp)
        # get_query_key_value_tensors with output_gate: [groups, (2 * per_group + 2) * d] then split
        grouped = local.view(groups // tp, (2 * per_group + 2) * d, -1)
        query, gate, key, value = grouped.split([per_group * d, per_group * d, d, d], dim=1)
        for g in range(groups // tp):
            group = rank * (groups // tp) + g
            for j in range(per_group):
                head = group * per_group + j
                # HF: q_proj(x).view(..., heads, 2 * d) then chunk(2) -> query first, gate second
                assert torch.equal(query[g, j * d : (j + 1) * d], q_proj[head, :d])
                assert torch.equal(gate[g, j * d : (j + 1) * d], q_proj[head, d:])
            assert torch.equal(key[g], k_proj[group])
            assert torch.equal(value[g], v_proj[group])


def test_swiglu_fc1_shard_is_gate_then_up():
    hf = random_hf(TINY)
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    rule = rules_for(TINY, [name], ShardPlace())[name]
    gate, up = rule.to_local(hf, 1, 2).chunk(2)  # Megatron's glu: torch.chunk(x, 2, dim=-1) -> act(gate) * up
    assert torch.equal(gate, hf["model.layers.0.mlp.gate_proj.weight"].chunk(2)[1])
    assert torch.equal(up, hf["model.layers.0.mlp.up_proj.weight"].chunk(2)[1])


def test_vocabulary_is_padded_to_a_multiple_of_tp_and_trimmed_back():
    arch = TINY.model_copy(update={"vocab_size": 4095})
    hf = {"model.embed_tokens.weight": torch.randn(4095, 8)}
    rule = rules_for(arch, ["embedding.word_embeddings.weight"], ShardPlace())["embedding.word_embeddings.weight"]
    shards = [rule.to_local(hf, r, 2) for r in range(2)]
    assert [s.shape[0] for s in shards] == [2048, 2048]
    assert torch.equal(shards[1][-1], torch.zeros(8))
    assert torch.equal(rule.to_hf(shards)["model.embed_tokens.weight"], hf["model.embed_tokens.weight"])


def test_expert_names_follow_the_expert_parallel_rank():
    name = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight"
    rule = rules_for(PROXY, [name], ShardPlace(ep_rank=1, ep_size=2))[name]
    assert rule.hf_names == ("model.layers.0.mlp.experts.3.down_proj.weight",)


def test_vision_language_names_map_to_the_text_model():
    assert canonical_hf_name("model.language_model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert canonical_hf_name("model.visual.blocks.0.attn.qkv.weight") is None
    assert canonical_hf_name("mtp.layers.0.input_layernorm.weight") is None
    assert canonical_hf_name("lm_head.weight") == "lm_head.weight"


@pytest.mark.parametrize("tp", [1, 2])
def test_qwen3_next_in_proj_gives_megatron_the_qwen35_shards(tp):
    """Qwen3-Next's per-key-head packing, regrouped, is exactly the Qwen3.5 tensors Megatron's shards come from."""
    hf = random_hf(NEXT)
    name = "decoder.layers.0.self_attention.in_proj.weight"
    next_rule = rules_for(NEXT, [name], ShardPlace())[name]
    qwen35_rule = rules_for(NEXT.model_copy(update={"model_type": "qwen3_5_moe_text"}), [name], ShardPlace())[name]
    prefix = "model.layers.0.linear_attn"
    parts = next_gdn_to_qwen35(hf[f"{prefix}.in_proj_qkvz.weight"], hf[f"{prefix}.in_proj_ba.weight"], NEXT)
    as_qwen35 = dict(zip(qwen35_rule.hf_names, parts, strict=True))
    for rank in range(tp):
        assert torch.equal(next_rule.to_local(hf, rank, tp), qwen35_rule.to_local(as_qwen35, rank, tp))
    packed = qwen35_gdn_to_next(*parts, NEXT)
    assert torch.equal(packed[0], hf[f"{prefix}.in_proj_qkvz.weight"])
    assert torch.equal(packed[1], hf[f"{prefix}.in_proj_ba.weight"])


def test_qwen3_next_regrouping_matches_transformers_split():
    """next_gdn_to_qwen35 reads in_proj_qkvz/ba the way transformers' Qwen3-Next layer splits its projections."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    from gdnctl.runtime.model.checkpoint import hf_text_config

    layer = Qwen3NextGatedDeltaNet(Qwen3NextConfig(**hf_text_config(NEXT)), layer_idx=0)
    x = torch.randn(1, 3, NEXT.hidden_size)
    query, key, value, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(x), layer.in_proj_ba(x))
    qkv, z_w, b_w, a_w = next_gdn_to_qwen35(layer.in_proj_qkvz.weight, layer.in_proj_ba.weight, NEXT)
    key_dim = NEXT.linear_num_key_heads * NEXT.linear_key_head_dim
    q_w, k_w, v_w = qkv.split([key_dim, key_dim, qkv.shape[0] - 2 * key_dim])
    for got, weight in ((query, q_w), (key, k_w), (value, v_w), (z, z_w), (b, b_w), (a, a_w)):
        torch.testing.assert_close(got.reshape(1, 3, -1), x @ weight.T)


def test_qwen3_next_is_qwen35_moe_up_to_the_gdn_projection_layout():
    """transformers' Qwen3-Next and Qwen3.5-MoE text models give the same logits once Qwen3-Next's GDN input
    projections are regrouped: so Qwen3-Next reuses the Qwen3.5 mapping to Megatron (checked against Megatron
    on GPU) with only the regrouping in front of it."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3NextConfig, Qwen3NextForCausalLM

    from gdnctl.runtime.model.checkpoint import hf_text_config

    torch.manual_seed(0)
    next_model = Qwen3NextForCausalLM(Qwen3NextConfig(**hf_text_config(NEXT))).eval()
    qwen35 = NEXT.model_copy(update={"model_type": "qwen3_5_moe_text", "architecture": "Qwen3_5MoeForCausalLM"})
    qwen35_model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**hf_text_config(qwen35))).eval()
    state = {}
    for name, tensor in next_model.state_dict().items():
        # Norm weights start at 0 or 1 and A_log/dt_bias at fixed values: perturb so a mix-up would show.
        tensor = tensor + 0.1 * torch.randn_like(tensor) if tensor.dim() == 1 else tensor
        if name.endswith("in_proj_ba.weight"):
            continue
        if name.endswith("in_proj_qkvz.weight"):
            prefix = name.removesuffix("in_proj_qkvz.weight")
            parts = next_gdn_to_qwen35(tensor, next_model.state_dict()[f"{prefix}in_proj_ba.weight"], NEXT)
            state.update(zip((f"{prefix}in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")), parts, strict=True))
        else:
            state[name] = tensor
    next_model.load_state_dict(
        {**next_model.state_dict(), **{n: t for n, t in state.items() if n in next_model.state_dict()}}
    )
    qwen35_model.load_state_dict(state, strict=True)
    tokens = torch.randint(0, NEXT.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(qwen35_model(tokens).logits, next_model(tokens).logits, rtol=1e-5, atol=1e-5)


def test_qwen3_next_config_reads_back_as_the_same_architecture(tmp_path):
    import json

    from gdnctl.knowledge.catalog import from_checkpoint
    from gdnctl.runtime.model.checkpoint import hf_text_config

    (tmp_path / "config.json").write_text(json.dumps(hf_text_config(NEXT)))
    back = from_checkpoint(str(tmp_path))
    assert (back.model_type, back.architecture) == ("qwen3_next", "Qwen3NextForCausalLM")
    fields = set(type(NEXT).model_fields) - {"id", "path", "released", "mtp_num_layers"}
    assert {f: getattr(back, f) for f in fields} == {f: getattr(NEXT, f) for f in fields}
