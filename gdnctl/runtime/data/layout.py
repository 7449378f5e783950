"""Token layouts: packed THD (one stream of tokens + cu_seqlens) and padded BSHD ([batch, seq] rows).

THD is what Megatron-Core 0.18+ runs GDN with (PackedSeqParams); BSHD is what models that need padded
input run with (AReaL's `requires_padded_seq`). The conversions are exact inverses, so a batch can be built
once and handed to either layout.

Padding values, the same in both layouts:
- input ids: `pad_token_id` (any id works: padded positions are masked out of the loss);
- labels: -100 (IGNORE_INDEX), torch's cross-entropy `ignore_index` and the HF/Megatron convention;
- loss mask: 0;
- position ids: each sequence counts from 0, and padding after a sequence keeps counting. Under a causal
  mask no real token attends to the padding that follows it, and counting on keeps positions inside the
  rotary table and makes the conversion lossless.

With context parallelism Megatron-Core 0.18 needs each packed sequence's length divisible by cp, so
`pack(..., pad_sequences_to_multiple_of=cp)` pads every sequence (not only the batch). `cu_seqlens` counts
real tokens; `cu_seqlens_padded` gives the offsets of the padded segments in the packed tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100
LOSS_MASK_PAD = 0


@dataclass(frozen=True)
class TokenSequence:
    """One sample: ids, labels (already aligned with the ids) and loss mask, all 1-D of the same length."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor

    def __post_init__(self) -> None:
        lengths = {tensor.dim() == 1 and tensor.numel() for tensor in (self.input_ids, self.labels, self.loss_mask)}
        if len(lengths) != 1 or not lengths.pop():
            raise ValueError(
                "A TokenSequence needs input_ids, labels and loss_mask as non-empty 1-D tensors of "
                "one length; pass one sample's tokens, not a batch."
            )


@dataclass(frozen=True)
class ThdBatch:
    """Packed tokens: every per-token tensor is 1-D of length `cu_seqlens_padded[-1]`."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor  # int32 [N + 1], real tokens
    cu_seqlens_padded: torch.Tensor  # int32 [N + 1], segment offsets in the packed tensors
    pad_token_id: int

    @property
    def seq_lens(self) -> torch.Tensor:
        return self.cu_seqlens.diff()

    @property
    def padded_seq_lens(self) -> torch.Tensor:
        return self.cu_seqlens_padded.diff()

    @property
    def max_seqlen(self) -> int:
        return int(self.padded_seq_lens.max())


@dataclass(frozen=True)
class BshdBatch:
    """Padded rows: every per-token tensor is [B, S]. `padded_seq_lens` are the THD segment lengths (real
    length rounded up to the per-sequence multiple), kept so `to_thd` restores the packing exactly."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    seq_lens: torch.Tensor  # int64 [B]
    padded_seq_lens: torch.Tensor  # int64 [B]
    pad_token_id: int

    @property
    def attention_mask(self) -> torch.Tensor:
        """True on real tokens, [B, S]."""
        columns = torch.arange(self.input_ids.shape[1], device=self.input_ids.device)
        return columns.unsqueeze(0) < self.seq_lens.unsqueeze(1)


def _round_up(values: torch.Tensor, multiple: int) -> torch.Tensor:
    return (values + multiple - 1) // multiple * multiple


def _check_multiple(name: str, multiple: int) -> None:
    if multiple < 1:
        raise ValueError(f"{name} is {multiple}; pass a positive integer (1 means no padding).")


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)


def pack(sequences: Sequence[TokenSequence], pad_sequences_to_multiple_of: int = 1, pad_token_id: int = 0) -> ThdBatch:
    """Pack samples into one THD stream, padding each to a multiple of `pad_sequences_to_multiple_of`
    (pass cp for context-parallel THD)."""
    _check_multiple("pad_sequences_to_multiple_of", pad_sequences_to_multiple_of)
    if not sequences:
        raise ValueError("pack() got no sequences; pass at least one TokenSequence.")
    device = sequences[0].input_ids.device
    seq_lens = torch.tensor([sequence.input_ids.numel() for sequence in sequences], dtype=torch.int64, device=device)
    padded_seq_lens = _round_up(seq_lens, pad_sequences_to_multiple_of)
    input_ids, labels, loss_mask = [], [], []
    for sequence, padding in zip(sequences, (padded_seq_lens - seq_lens).tolist(), strict=True):
        input_ids += [sequence.input_ids, sequence.input_ids.new_full((padding,), pad_token_id)]
        labels += [sequence.labels, sequence.labels.new_full((padding,), IGNORE_INDEX)]
        loss_mask += [sequence.loss_mask, sequence.loss_mask.new_full((padding,), LOSS_MASK_PAD)]
    cu_seqlens_padded = _cumulative(padded_seq_lens)
    return ThdBatch(
        input_ids=torch.cat(input_ids),
        labels=torch.cat(labels),
        loss_mask=torch.cat(loss_mask),
        position_ids=_segment_positions(cu_seqlens_padded, padded_seq_lens),
        cu_seqlens=_cumulative(seq_lens),
        cu_seqlens_padded=cu_seqlens_padded,
        pad_token_id=pad_token_id,
    )


def unpack(thd: ThdBatch) -> list[TokenSequence]:
    """The samples `pack` was given (padding dropped)."""
    starts = thd.cu_seqlens_padded[:-1].tolist()
    return [
        TokenSequence(
            thd.input_ids[start : start + length],
            thd.labels[start : start + length],
            thd.loss_mask[start : start + length],
        )
        for start, length in zip(starts, thd.seq_lens.tolist(), strict=True)
    ]


def _segment_positions(cu_seqlens_padded: torch.Tensor, padded_seq_lens: torch.Tensor) -> torch.Tensor:
    total = int(cu_seqlens_padded[-1])
    segment_starts = torch.repeat_interleave(cu_seqlens_padded[:-1].long(), padded_seq_lens.long())
    return torch.arange(total, dtype=torch.int64, device=segment_starts.device) - segment_starts


def positions_within_segments(lengths: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... restarting at each of consecutive segments of these lengths (int64)."""
    return _segment_positions(_cumulative(lengths), lengths)


def _thd_coordinates(cu_seqlens_padded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) in BSHD of every packed token."""
    padded_seq_lens = cu_seqlens_padded.diff().long()
    rows = torch.repeat_interleave(
        torch.arange(padded_seq_lens.numel(), device=padded_seq_lens.device), padded_seq_lens
    )
    return rows, _segment_positions(cu_seqlens_padded, padded_seq_lens)


def to_bshd(thd: ThdBatch, pad_to_multiple_of: int = 1) -> BshdBatch:
    """One row per packed sequence, padded to the longest padded sequence rounded up to `pad_to_multiple_of`."""
    _check_multiple("pad_to_multiple_of", pad_to_multiple_of)
    padded_seq_lens = thd.padded_seq_lens.long()
    width = int(_round_up(padded_seq_lens.max(), pad_to_multiple_of))
    rows, columns = _thd_coordinates(thd.cu_seqlens_padded)
    shape = (padded_seq_lens.numel(), width)

    def spread(tokens: torch.Tensor, background: torch.Tensor) -> torch.Tensor:
        background[rows, columns] = tokens
        return background

    counting_positions = torch.arange(width, dtype=thd.position_ids.dtype, device=thd.position_ids.device)
    return BshdBatch(
        input_ids=spread(thd.input_ids, thd.input_ids.new_full(shape, thd.pad_token_id)),
        labels=spread(thd.labels, thd.labels.new_full(shape, IGNORE_INDEX)),
        loss_mask=spread(thd.loss_mask, thd.loss_mask.new_full(shape, LOSS_MASK_PAD)),
        position_ids=spread(thd.position_ids, counting_positions.repeat(shape[0], 1)),
        seq_lens=thd.seq_lens.long(),
        padded_seq_lens=padded_seq_lens,
        pad_token_id=thd.pad_token_id,
    )


def to_thd(bshd: BshdBatch) -> ThdBatch:
    """Pack the rows back, keeping each row's first `padded_seq_lens` tokens."""
    if int(bshd.padded_seq_lens.max()) > bshd.input_ids.shape[1]:
        raise ValueError(
            f"BshdBatch.padded_seq_lens reach {int(bshd.padded_seq_lens.max())} but rows hold "
            f"{bshd.input_ids.shape[1]} tokens; make padded_seq_lens at most the row width."
        )
    cu_seqlens_padded = _cumulative(bshd.padded_seq_lens)
    rows, columns = _thd_coordinates(cu_seqlens_padded)
    return ThdBatch(
        input_ids=bshd.input_ids[rows, columns],
        labels=bshd.labels[rows, columns],
        loss_mask=bshd.loss_mask[rows, columns],
        position_ids=bshd.position_ids[rows, columns],
        cu_seqlens=_cumulative(bshd.seq_lens),
        cu_seqlens_padded=cu_seqlens_padded,
        pad_token_id=bshd.pad_token_id,
    )
