"""Which tokens of a packed row each context-parallel rank holds: Megatron-Core's load-balanced layout.

Every packed sequence (padded to a multiple of 2·cp) is cut into 2·cp equal chunks, and CP rank r holds chunks r
and 2·cp-1-r of each sequence, in that order, sequence after sequence. Under a causal mask the early chunks see
few tokens and the late ones many, so pairing chunk r with its mirror gives every rank the same attention work.

This is the layout the rest of Megatron-Core reads the local tokens in, so it is not a choice:
- Transformer Engine's THD attention with CP: `tex.thd_get_partitioned_indices(cu_seqlens_padded, total, cp, r)`,
  which Megatron-Core 0.19's `megatron/core/utils.py _get_batch_on_this_cp_rank_per_document_balancing` applies to
  tokens, labels, loss mask and position ids (cu_seqlens stay the whole row's);
- the GDN layer's CP all-to-all (megatron/core/ssm/gated_delta_net/common.py `_build_thd_cp_a2a_perm`, 0.19):
  after the all-to-all it holds the CP ranks' local tokens one rank after another and restores the natural
  order with an index built on exactly this chunk assignment.
"""

from __future__ import annotations

import torch

from gdnctl.runtime.data.layout import positions_within_segments


def context_parallel_positions(segment_lengths: torch.Tensor, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Positions in the row (int64, ascending within each chunk) of the tokens CP rank `cp_rank` holds.

    `segment_lengths` are the packed sequences' padded lengths, one after another from position 0; each must
    be a multiple of 2·cp_size. With cp_size 1 every position is returned."""
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(
            f"cp_rank {cp_rank} is outside [0, {cp_size}); pass this rank's context-parallel rank "
            "and a positive context-parallel size."
        )
    lengths = segment_lengths.long()
    chunks = 2 * cp_size
    if bool((lengths % chunks != 0).any()):
        raise ValueError(
            f"packed sequence lengths {lengths.tolist()} are not all multiples of 2 x cp = {chunks}; "
            "pad every sequence to that multiple (DataPipeline does, from sequence_padding_multiple)."
        )
    starts = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
    chunk_lengths = lengths // chunks
    # Per sequence: chunk r, then its mirror 2·cp-1-r.
    first = starts + cp_rank * chunk_lengths
    mirror = starts + (chunks - 1 - cp_rank) * chunk_lengths
    chunk_starts = torch.stack([first, mirror], dim=1).reshape(-1)
    chunk_sizes = chunk_lengths.repeat_interleave(2)
    return torch.repeat_interleave(chunk_starts, chunk_sizes) + positions_within_segments(chunk_sizes)
