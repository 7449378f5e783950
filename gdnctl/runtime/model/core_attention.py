"""Causal core attention on torch's kernels, for padded (sbhd) and packed (thd) input: the TE-free model's only
attention, and the bridge model's wherever Transformer Engine's would train on wrong gradients.

Why the bridge model swaps TE's attention out on packed rows (measured on an H100, TE 2.20.2 with the cuDNN 9.14 it
loads, torch 2.11): with no FlashAttention package installed, TE's DotProductAttention runs cuDNN's fused attention
("FusedAttention sub-backend 1"), and its THD backward at Qwen3.5's head_dim 256 with 16 query and 2 KV heads is
wrong: the query gradient 15-19% off a per-sequence fp32 reference in every trial (25 of 25 over two machines, one
sequence alone included; 39-41% with 8x larger q and k), dK/dV off or non-finite in packed rows. Its forward is right
to 0.2%, and on full rows (SBHD) the same backend is right to 0.3%. On the 35B-A3B proxy that was the NaN gradient at
step 2 and NaN loss from step 3 (the first non-finite gradient appeared in the backward of layer 7's attention).
Torch's varlen FlashAttention on the same inputs is within 0.3% of the reference, as is per-sequence SDPA. The
check: benchmarks/attention_check.py.

Packed rows go through `torch.nn.attention.varlen.varlen_attn` (FlashAttention, one launch for every sequence of a
row, cu_seqlens on the GPU and the longest length from the host: no synchronisation) where torch has it; older torch
attends sequence by sequence with SDPA. Each sequence is attended from its padded start, so no token sees another
document.
"""

from __future__ import annotations

import inspect
import itertools

import torch
import torch.nn.functional as F
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule

from gdnctl.runtime.model.megatron_config import ModelBuildError

try:  # torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - the pinned CPU torch has it; older GPU stacks fall back to SDPA
    varlen_attn = None
# torch 2.11's varlen_attn has no GQA flag: the KV heads are repeated for it (what SDPA's enable_gqa computes).
_VARLEN_GQA = varlen_attn is not None and "enable_gqa" in inspect.signature(varlen_attn).parameters
# (left, right) window of varlen_attn: everything before, nothing after (causal).
_CAUSAL_WINDOW = (-1, 0)


class TorchCoreAttention(MegatronModule):
    """Megatron's core-attention interface (query, key, value as [s, b, heads, d], or [t, heads, d] packed) on
    torch's SDPA and varlen FlashAttention."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size > 1:
            raise ModelBuildError(
                "context parallel full attention needs Transformer Engine's attention; set "
                "parallel.cp: 1 or kernels.attention: te"
            )
        self.softmax_scale = softmax_scale

    def forward(
        self,
        query,
        key,
        value,
        attention_mask,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
        **unused,
    ):
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            return self._packed(query, key, value, packed_seq_params)
        # [s, b, heads, d] -> [b, heads, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=True)
        seq, batch = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(seq, batch, -1)

    def _packed(self, query, key, value, params):
        """[t, heads, d] in and out."""
        cu_seqlens = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
        if varlen_attn is not None and query.is_cuda:
            options = {"enable_gqa": True} if _VARLEN_GQA else {}
            if not _VARLEN_GQA and key.shape[1] != query.shape[1]:
                groups = query.shape[1] // key.shape[1]
                key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
            longest = int(params.max_seqlen_q)
            return varlen_attn(
                query,
                key,
                value,
                cu_seqlens,
                cu_seqlens,
                longest,
                longest,
                scale=self.softmax_scale,
                window_size=_CAUSAL_WINDOW,
                **options,
            )
        bounds = cu_seqlens.tolist()
        outputs = []
        for start, end in itertools.pairwise(bounds):
            # [t, heads, d] -> [1, heads, t, d]
            q, k, v = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (query, key, value))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=True)
            outputs.append(out.squeeze(0).transpose(0, 1))
        return torch.cat(outputs, dim=0)


def replace_core_attention(model) -> list[str]:
    """Give every self-attention layer of a built model a TorchCoreAttention in place of its core attention
    (TE's DotProductAttention holds no parameters, so weights, checkpoints and exports are unchanged); returns
    the names of the layers changed."""
    from megatron.core.transformer.attention import SelfAttention

    changed = []
    for name, module in model.named_modules():
        if isinstance(module, SelfAttention) and not isinstance(module.core_attention, TorchCoreAttention):
            module.core_attention = TorchCoreAttention(
                module.config,
                layer_number=module.layer_number,
                attn_mask_type=module.attn_mask_type,
                attention_type="self",
                softmax_scale=module.config.softmax_scale,
            )
            changed.append(name)
    return changed
