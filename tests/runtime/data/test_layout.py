"""THD <-> BSHD layout conversion: exact round trips and documented padding (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdnctl.runtime.data import layout
from gdnctl.runtime.data.layout import IGNORE_INDEX, TokenSequence


@st.composite
def sequences(draw) -> list[TokenSequence]:
    lengths = draw(st.lists(st.integers(1, 40), min_size=1, max_size=6))
    samples = []
    for length in lengths:
        ids = draw(st.lists(st.integers(0, 50_000), min_size=length + 1, max_size=length + 1))
        mask = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=length, max_size=length))
        samples.append(TokenSequence(torch.tensor(ids[:-1]), torch.tensor(ids[1:]), torch.tensor(mask)))
    return samples


multiples = st.sampled_from([1, 2, 3, 4, 8])


def _same(left, right) -> bool:
    return all(
        torch.equal(value, getattr(right, key)) if isinstance(value, torch.Tensor) else value == getattr(right, key)
        for key, value in vars(left).items()
    )


@settings(max_examples=150, deadline=None)
@given(sequences(), multiples, multiples, st.integers(0, 7))
def test_round_trips_are_exact(samples, cp, pad_to, pad_token_id):
    thd = layout.pack(samples, pad_sequences_to_multiple_of=cp, pad_token_id=pad_token_id)
    assert all(map(_same, layout.unpack(thd), samples))
    bshd = layout.to_bshd(thd, pad_to_multiple_of=pad_to)
    assert _same(layout.to_thd(bshd), thd)
    assert _same(layout.to_bshd(layout.to_thd(bshd), pad_to_multiple_of=pad_to), bshd)


@settings(max_examples=100, deadline=None)
@given(sequences(), multiples, multiples)
def test_padding_follows_the_documented_values(samples, cp, pad_to):
    thd = layout.pack(samples, pad_sequences_to_multiple_of=cp, pad_token_id=0)
    lengths = torch.tensor([sample.input_ids.numel() for sample in samples])
    assert torch.equal(thd.seq_lens, lengths.int())
    assert not bool((thd.padded_seq_lens % cp).any()) and bool((thd.padded_seq_lens - thd.seq_lens < cp).all())
    assert thd.cu_seqlens.dtype == thd.cu_seqlens_padded.dtype == torch.int32
    assert thd.max_seqlen == int(thd.padded_seq_lens.max())
    for start, length, padded in zip(
        thd.cu_seqlens_padded[:-1].tolist(), thd.seq_lens.tolist(), thd.padded_seq_lens.tolist(), strict=True
    ):
        assert thd.position_ids[start : start + padded].tolist() == list(range(padded))  # restart at 0
        padding = slice(start + length, start + padded)
        assert (thd.labels[padding] == IGNORE_INDEX).all() and (thd.loss_mask[padding] == 0).all()

    bshd = layout.to_bshd(thd, pad_to_multiple_of=pad_to)
    width = bshd.input_ids.shape[1]
    assert width % pad_to == 0 and width >= thd.max_seqlen
    mask = bshd.attention_mask
    assert torch.equal(mask.sum(1), lengths)
    assert (bshd.labels[~mask] == IGNORE_INDEX).all() and (bshd.loss_mask[~mask] == 0).all()
    assert (bshd.input_ids[~mask] == 0).all()
    assert torch.equal(bshd.position_ids, torch.arange(width).expand(len(samples), width))


def test_a_single_sequence_with_cp_padding():
    sample = TokenSequence(torch.tensor([5, 6, 7]), torch.tensor([6, 7, 8]), torch.tensor([1, 1, 0]))
    thd = layout.pack([sample], pad_sequences_to_multiple_of=4, pad_token_id=9)
    assert thd.input_ids.tolist() == [5, 6, 7, 9]
    assert thd.labels.tolist() == [6, 7, 8, IGNORE_INDEX]
    assert thd.cu_seqlens.tolist() == [0, 3] and thd.cu_seqlens_padded.tolist() == [0, 4]


def test_bad_input_is_refused_with_a_sentence():
    with pytest.raises(ValueError, match="at least one TokenSequence"):
        layout.pack([])
    with pytest.raises(ValueError, match="positive integer"):
        layout.pack([TokenSequence(torch.ones(2), torch.ones(2), torch.ones(2))], pad_sequences_to_multiple_of=0)
    with pytest.raises(ValueError, match="one length"):
        TokenSequence(torch.ones(2), torch.ones(3), torch.ones(2))
    thd = layout.pack([TokenSequence(torch.ones(4), torch.ones(4), torch.ones(4))])
    bshd = layout.to_bshd(thd)
    narrow = layout.BshdBatch(
        bshd.input_ids[:, :2],
        bshd.labels[:, :2],
        bshd.loss_mask[:, :2],
        bshd.position_ids[:, :2],
        bshd.seq_lens,
        bshd.padded_seq_lens,
        0,
    )
    with pytest.raises(ValueError, match="row width"):
        layout.to_thd(narrow)
