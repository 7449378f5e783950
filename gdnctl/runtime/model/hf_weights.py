"""Megatron-Core parameter shards <-> Hugging Face Qwen3.5 / Qwen3-Next tensors.

Pure tensor logic, no process groups: `to_local` cuts one rank's shard of a Megatron parameter out of the HF
tensors, `to_hf` turns the shards of all tensor-parallel ranks (in rank order) back into HF tensors. The
checkpoint module does the IO and the gathering around it.

Layouts (Megatron-Core 0.19, `megatron/core/ssm/gated_delta_net` and `transformer/attention.py`):
- GDN in_proj: each TP rank holds [q_r, k_r, v_r, z_r, beta_r, alpha_r], every section cut per rank; Qwen3.5
  HF has in_proj_qkv ([q; k; v]), in_proj_z, in_proj_b, in_proj_a; Qwen3-Next HF packs the same rows per key
  head into in_proj_qkvz and in_proj_ba (see `next_gdn_to_qwen35`). conv1d holds [q_r, k_r, v_r] channels
  (the same order in both HF layouts). Everything else has the same names and layout in Qwen3.5 and Qwen3-Next.
- Gated attention linear_qkv: per query group [q heads, gate heads, k, v] (each head_dim rows), groups in
  order, the whole cut evenly over TP; HF q_proj interleaves per head [q_h; gate_h].
- Dense MLP linear_fc1: each rank holds [gate_r; up_r].
- Vocabulary rows are padded to a multiple of TP (padded_vocab_size) and cut over TP.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from gdnctl.knowledge import ModelArch


@dataclass(frozen=True)
class ShardPlace:
    """Where this rank's shards sit: tensor-parallel rank and size (expert-TP for expert weights), expert
    parallel rank and size, and the global index of this pipeline stage's first layer."""

    tp_rank: int = 0
    tp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1
    layer_offset: int = 0


@dataclass(frozen=True)
class Rule:
    """How one Megatron parameter maps to HF tensors.

    `hf_names` are the HF tensors it is made of; `to_local(hf, rank, size)` cuts a shard from them;
    `to_hf(shards)` rebuilds them from every rank's shard; `group` says which ranks hold the shards
    ("tp", "etp", or "none" for a replicated parameter)."""

    hf_names: tuple[str, ...]
    to_local: Callable[[Mapping[str, torch.Tensor], int, int], torch.Tensor]
    to_hf: Callable[[list[torch.Tensor]], dict[str, torch.Tensor]]
    group: str


class UnknownParameter(KeyError):
    pass


def _replicated(hf_name: str) -> Rule:
    return Rule((hf_name,), lambda hf, rank, size: hf[hf_name], lambda shards: {hf_name: shards[0]}, "none")


def _split(hf_name: str, dim: int, group: str = "tp") -> Rule:
    return Rule(
        (hf_name,),
        lambda hf, rank, size: hf[hf_name].chunk(size, dim)[rank].contiguous(),
        lambda shards: {hf_name: torch.cat(shards, dim)},
        group,
    )


def _sections(hf_names: tuple[str, ...], sections: list[tuple[str, int]], group: str = "tp") -> Rule:
    """A parameter whose rows are named sections, each cut over the ranks separately: rank r holds the r-th
    piece of every section, in order. `sections` lists (HF tensor, rows); sections of one HF tensor are
    consecutive row ranges of it."""
    pieces = []
    offsets: dict[str, int] = {}
    for name, rows in sections:
        pieces.append((name, offsets.get(name, 0), rows))
        offsets[name] = offsets.get(name, 0) + rows

    def to_local(hf, rank, size):
        parts = [hf[name][start : start + rows].chunk(size, 0)[rank] for name, start, rows in pieces]
        return torch.cat(parts, 0).contiguous()

    def to_hf(shards):
        per_rank = [rows // len(shards) for _, _, rows in pieces]
        split = [shard.split(per_rank, 0) for shard in shards]
        result: dict[str, list[torch.Tensor]] = {}
        for index, (name, _, _) in enumerate(pieces):
            result.setdefault(name, []).append(torch.cat([parts[index] for parts in split], 0))
        return {name: torch.cat(parts, 0) for name, parts in result.items()}

    return Rule(hf_names, to_local, to_hf, group)


def next_gdn_to_qwen35(qkvz: torch.Tensor, ba: torch.Tensor, arch: ModelArch) -> tuple[torch.Tensor, ...]:
    """Qwen3-Next's GDN input projection -> Qwen3.5's (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a).

    Qwen3-Next groups the rows by key head (transformers' Qwen3NextGatedDeltaNet.fix_query_key_value_ordering):
    in_proj_qkvz is, for each key head, [q (dk rows), k (dk), v (G * dv), z (G * dv)] with G value heads per key
    head, and in_proj_ba is, for each key head, [b (G rows), a (G)]. Qwen3.5 keeps each of q, k, v, z, b, a
    whole; value head j belongs to key head j // G in both, so regrouping is all there is to it."""
    key_heads, dk, dv = arch.linear_num_key_heads, arch.linear_key_head_dim, arch.linear_value_head_dim
    group = arch.linear_num_value_heads // key_heads
    hidden = qkvz.shape[-1]
    per_head = qkvz.view(key_heads, 2 * dk + 2 * group * dv, hidden)
    q, k, v, z = per_head.split([dk, dk, group * dv, group * dv], dim=1)
    b, a = ba.view(key_heads, 2 * group, hidden).split([group, group], dim=1)
    qkv = torch.cat([q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden)], 0)
    return qkv, z.reshape(-1, hidden), b.reshape(-1, hidden), a.reshape(-1, hidden)


def qwen35_gdn_to_next(
    qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor, arch: ModelArch
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `next_gdn_to_qwen35`: Qwen3.5's four tensors -> Qwen3-Next's (in_proj_qkvz, in_proj_ba)."""
    key_heads, dk, dv = arch.linear_num_key_heads, arch.linear_key_head_dim, arch.linear_value_head_dim
    group = arch.linear_num_value_heads // key_heads
    hidden = qkv.shape[-1]
    q, k, v = qkv.split([key_heads * dk, key_heads * dk, key_heads * group * dv], 0)
    qkvz = torch.cat(
        [
            q.view(key_heads, dk, hidden),
            k.view(key_heads, dk, hidden),
            v.view(key_heads, group * dv, hidden),
            z.view(key_heads, group * dv, hidden),
        ],
        1,
    )
    ba = torch.cat([b.view(key_heads, group, hidden), a.view(key_heads, group, hidden)], 1)
    return qkvz.reshape(-1, hidden), ba.reshape(-1, hidden)


def _next_in_proj(arch: ModelArch, hf: str, qwen35: Rule) -> Rule:
    """Qwen3.5's in_proj rule behind Qwen3-Next's packing: regroup on the way in and on the way out."""
    qkvz, ba = f"{hf}.in_proj_qkvz.weight", f"{hf}.in_proj_ba.weight"

    def to_local(tensors, rank, size):
        parts = next_gdn_to_qwen35(tensors[qkvz], tensors[ba], arch)
        return qwen35.to_local(dict(zip(qwen35.hf_names, parts, strict=True)), rank, size)

    def to_hf(shards):
        parts = qwen35.to_hf(shards)
        packed = qwen35_gdn_to_next(*(parts[name] for name in qwen35.hf_names), arch)
        return dict(zip((qkvz, ba), packed, strict=True))

    return Rule((qkvz, ba), to_local, to_hf, qwen35.group)


def _gdn_rules(arch: ModelArch, hf: str, mg: str) -> dict[str, Rule]:
    key_dim = arch.linear_num_key_heads * arch.linear_key_head_dim
    value_dim = arch.linear_num_value_heads * arch.linear_value_head_dim
    heads = arch.linear_num_value_heads
    qkv, z, b, a = (f"{hf}.in_proj_{part}.weight" for part in ("qkv", "z", "b", "a"))
    in_proj = [(qkv, key_dim), (qkv, key_dim), (qkv, value_dim), (z, value_dim), (b, heads), (a, heads)]
    in_proj_rule = _sections((qkv, z, b, a), in_proj)
    if arch.family.gdn_in_projection == "per_key_head":
        in_proj_rule = _next_in_proj(arch, hf, in_proj_rule)
    conv = f"{hf}.conv1d.weight"
    return {
        f"{mg}.in_proj.weight": in_proj_rule,
        f"{mg}.conv1d.weight": _sections((conv,), [(conv, key_dim), (conv, key_dim), (conv, value_dim)]),
        f"{mg}.dt_bias": _split(f"{hf}.dt_bias", 0),
        f"{mg}.A_log": _split(f"{hf}.A_log", 0),
        f"{mg}.out_norm.weight": _replicated(f"{hf}.norm.weight"),
        f"{mg}.out_proj.weight": _split(f"{hf}.out_proj.weight", 1),
    }


def _gated_qkv(arch: ModelArch, hf: str) -> Rule:
    heads, groups, dim = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    per_group = heads // groups
    names = (f"{hf}.q_proj.weight", f"{hf}.k_proj.weight", f"{hf}.v_proj.weight")

    def megatron_global(tensors):
        q_proj, k_proj, v_proj = (tensors[name] for name in names)
        hidden = q_proj.shape[-1]
        query_and_gate = q_proj.view(heads, 2, dim, hidden)
        query, gate = query_and_gate[:, 0], query_and_gate[:, 1]
        key, value = k_proj.view(groups, dim, hidden), v_proj.view(groups, dim, hidden)
        blocks = []
        for group in range(groups):
            members = slice(group * per_group, (group + 1) * per_group)
            blocks += [query[members].reshape(-1, hidden), gate[members].reshape(-1, hidden), key[group], value[group]]
        return torch.cat(blocks, 0)

    def to_hf(shards):
        whole = torch.cat(shards, 0)
        hidden = whole.shape[-1]
        grouped = whole.view(groups, (2 * per_group + 2) * dim, hidden)
        query = grouped[:, : per_group * dim].reshape(heads, dim, hidden)
        gate = grouped[:, per_group * dim : 2 * per_group * dim].reshape(heads, dim, hidden)
        key = grouped[:, 2 * per_group * dim : (2 * per_group + 1) * dim].reshape(groups * dim, hidden)
        value = grouped[:, (2 * per_group + 1) * dim :].reshape(groups * dim, hidden)
        q_proj = torch.stack([query, gate], 1).reshape(heads * 2 * dim, hidden)
        return {names[0]: q_proj, names[1]: key.contiguous(), names[2]: value.contiguous()}

    return Rule(
        names, lambda tensors, rank, size: megatron_global(tensors).chunk(size, 0)[rank].contiguous(), to_hf, "tp"
    )


def _attention_rules(arch: ModelArch, hf: str, mg: str) -> dict[str, Rule]:
    return {
        f"{mg}.linear_qkv.weight": _gated_qkv(arch, hf),
        f"{mg}.q_layernorm.weight": _replicated(f"{hf}.q_norm.weight"),
        f"{mg}.k_layernorm.weight": _replicated(f"{hf}.k_norm.weight"),
        f"{mg}.linear_proj.weight": _split(f"{hf}.o_proj.weight", 1),
    }


def _mlp_rules(hf: str, mg: str, group: str = "tp") -> dict[str, Rule]:
    return {
        f"{mg}.linear_fc1.weight": _fc1(f"{hf}.gate_proj.weight", f"{hf}.up_proj.weight", group),
        f"{mg}.linear_fc2.weight": _split(f"{hf}.down_proj.weight", 1, group),
    }


def _fc1(gate: str, up: str, group: str) -> Rule:
    """SwiGLU fc1: each rank holds [gate_r; up_r]."""

    def to_local(tensors, rank, size):
        return torch.cat([tensors[gate].chunk(size, 0)[rank], tensors[up].chunk(size, 0)[rank]], 0).contiguous()

    def to_hf(shards):
        halves = [shard.chunk(2, 0) for shard in shards]
        return {gate: torch.cat([h[0] for h in halves], 0), up: torch.cat([h[1] for h in halves], 0)}

    return Rule((gate, up), to_local, to_hf, group)


def _moe_rules(arch: ModelArch, hf: str, mg: str, place: ShardPlace) -> dict[str, Rule]:
    rules = {f"{mg}.router.weight": _replicated(f"{hf}.gate.weight")}
    local_experts = arch.num_experts // place.ep_size
    for local in range(local_experts):
        expert = place.ep_rank * local_experts + local
        rules.update(_mlp_rules(f"{hf}.experts.{expert}", f"{mg}.experts.local_experts.{local}", group="etp"))
    if arch.shared_expert_ffn_hidden_size:
        rules.update(_mlp_rules(f"{hf}.shared_expert", f"{mg}.shared_experts"))
        rules[f"{mg}.shared_experts.gate_weight"] = _replicated(f"{hf}.shared_expert_gate.weight")
    return rules


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """Megatron's vocab-parallel embedding needs the vocabulary divisible by TP; extra rows are never labels."""
    return -(-vocab_size // tp) * tp


def _vocab(hf_name: str, vocab_size: int) -> Rule:
    """Vocabulary rows: HF has vocab_size, Megatron pads to a multiple of TP and cuts over TP."""

    def to_local(tensors, rank, size):
        rows = tensors[hf_name]
        padded = padded_vocab_size(vocab_size, size)
        if padded != rows.shape[0]:
            rows = torch.cat([rows, rows.new_zeros(padded - rows.shape[0], *rows.shape[1:])], 0)
        return rows.chunk(size, 0)[rank].contiguous()

    return Rule((hf_name,), to_local, lambda shards: {hf_name: torch.cat(shards, 0)[:vocab_size]}, "tp")


_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")


def rules_for(arch: ModelArch, megatron_names: list[str], place: ShardPlace) -> dict[str, Rule]:
    """The rule of every named Megatron parameter of this rank (UnknownParameter for one gdnctl cannot map)."""
    return {name: _rule(arch, name, place) for name in megatron_names}


def _rule(arch: ModelArch, name: str, place: ShardPlace) -> Rule:
    if name == "embedding.word_embeddings.weight":
        return _vocab("model.embed_tokens.weight", arch.vocab_size)
    if name == "output_layer.weight":
        return _vocab("lm_head.weight", arch.vocab_size)
    if name == "decoder.final_layernorm.weight":
        return _replicated("model.norm.weight")
    match = _LAYER.fullmatch(name)
    if match:
        index = place.layer_offset + int(match.group(1))
        hf, mg = f"model.layers.{index}", f"decoder.layers.{match.group(1)}"
        table = {
            f"{mg}.input_layernorm.weight": _replicated(f"{hf}.input_layernorm.weight"),
            f"{mg}.pre_mlp_layernorm.weight": _replicated(f"{hf}.post_attention_layernorm.weight"),
        }
        if arch.layer_is_gdn(index):
            table.update(_gdn_rules(arch, f"{hf}.linear_attn", f"{mg}.self_attention"))
        else:
            table.update(_attention_rules(arch, f"{hf}.self_attn", f"{mg}.self_attention"))
        if arch.is_moe:
            table.update(_moe_rules(arch, f"{hf}.mlp", f"{mg}.mlp", place))
        else:
            table.update(_mlp_rules(f"{hf}.mlp", f"{mg}.mlp"))
        if name in table:
            return table[name]
    raise UnknownParameter(name)


def group_rank_and_size(rule: Rule, place: ShardPlace) -> tuple[int, int]:
    if rule.group == "tp":
        return place.tp_rank, place.tp_size
    if rule.group == "etp":
        return place.etp_rank, place.etp_size
    return 0, 1


# HF checkpoints of the vision-language classes keep the language model under this prefix; weights of the
# vision tower and the MTP head have no Megatron counterpart in the text model: they are not loaded, and every
# save carries them over from the source checkpoint unchanged (passthrough.py).
VL_PREFIX = "model.language_model."
VISION_PREFIX = "model.visual."
IGNORED_HF_PREFIXES = (VISION_PREFIX, "mtp.", "model.mtp.")


def canonical_hf_name(name: str) -> str | None:
    """The text-model name of a checkpoint tensor, or None for one the text model does not use."""
    if name.startswith(IGNORED_HF_PREFIXES):
        return None
    if name.startswith(VL_PREFIX):
        return "model." + name[len(VL_PREFIX) :]
    return name
