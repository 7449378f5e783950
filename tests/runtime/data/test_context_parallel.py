"""Context parallel: which tokens of a packed row each CP rank holds, and the micro-batches a CP rank is handed.

The layout is Megatron-Core's (chunks r and 2·cp-1-r of every sequence on CP rank r). tests/gpu/
test_context_parallel_gpu.py checks the positions against Transformer Engine's thd_get_partitioned_indices and
Megatron-Core 0.19's GDN all-to-all permutation, and trains CP=2 against CP=1 on two GPUs.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdnctl.runtime.data import pipeline as data
from gdnctl.runtime.data.context_parallel import context_parallel_positions
from gdnctl.runtime.data.pipeline import DataPipeline

VOCAB_SIZE = 64


def test_each_rank_holds_its_chunk_and_the_mirror_chunk_of_every_sequence():
    # Two sequences of 8 and 4 positions, cp 2: chunks of 2 and of 1 position.
    lengths = torch.tensor([8, 4])
    assert context_parallel_positions(lengths, 2, 0).tolist() == [0, 1, 6, 7, 8, 11]
    assert context_parallel_positions(lengths, 2, 1).tolist() == [2, 3, 4, 5, 9, 10]
    assert context_parallel_positions(lengths, 1, 0).tolist() == list(range(12))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.lists(st.integers(1, 6), min_size=1, max_size=8))
def test_the_ranks_hold_every_position_once_and_equal_shares_of_each_sequence(cp, chunk_lengths):
    lengths = torch.tensor([2 * cp * n for n in chunk_lengths])
    shares = [context_parallel_positions(lengths, cp, rank) for rank in range(cp)]
    assert sorted(torch.cat(shares).tolist()) == list(range(int(lengths.sum())))
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    for share in shares:
        per_sequence = torch.bucketize(share, starts[1:], right=True).bincount(minlength=len(lengths))
        assert per_sequence.tolist() == (lengths // cp).tolist()
        # ascending within each chunk: the two chunks of a sequence are contiguous runs
        runs = (share.diff() != 1).sum().item() + 1
        assert runs <= 2 * len(lengths)


def test_lengths_that_do_not_split_into_two_cp_chunks_are_refused():
    with pytest.raises(ValueError, match="multiples of 2 x cp = 4"):
        context_parallel_positions(torch.tensor([8, 6]), 2, 0)
    with pytest.raises(ValueError, match="cp_rank 2 is outside"):
        context_parallel_positions(torch.tensor([8]), 2, 2)


def _pipeline(cp: int, layout: str = "thd", multiple: int | None = None) -> DataPipeline:
    documents = data.synthetic_documents(24, vocab_size=VOCAB_SIZE, min_length=2, max_length=40, seed=3)
    return DataPipeline(
        documents,
        layout=layout,
        seq_length=64,
        micro_batch_size=1,
        global_batch_size=4,
        dp=2,
        seed=5,
        pad_sequences_to_multiple_of=2 * cp if multiple is None else multiple,
        cp=cp,
    )


def test_a_cp_rank_is_handed_its_tokens_and_the_whole_rows_metadata():
    pipeline = _pipeline(cp=2)
    for dp_rank in range(pipeline.dp):
        whole = pipeline._micro_batches(dp_rank, 0)
        ranks = [pipeline.micro_batches(dp_rank, 0, cp_rank) for cp_rank in range(2)]
        for _ in range(5):
            full = next(whole)
            shards = [next(stream) for stream in ranks]
            for cp_rank, shard in enumerate(shards):
                positions = context_parallel_positions(full.batch.padded_seq_lens, 2, cp_rank)
                for name in ("tokens", "labels", "loss_mask", "position_ids"):
                    assert torch.equal(getattr(shard, name), getattr(full, name)[:, positions]), name
                assert torch.equal(shard.cu_seqlens, full.cu_seqlens)
                assert torch.equal(shard.cu_seqlens_padded, full.cu_seqlens_padded)
                assert (shard.max_seqlen, shard.row_length) == (full.max_seqlen, full.tokens.shape[1])
                assert (shard.num_real_tokens, shard.num_loss_tokens) == (full.num_real_tokens, full.num_loss_tokens)
            # The two ranks' loss tokens together are the row's: nothing counted twice, nothing lost.
            assert sum(int(shard.loss_mask.sum()) for shard in shards) == full.num_loss_tokens
            assert shards[0].tokens.shape[1] == shards[1].tokens.shape[1] == full.tokens.shape[1] // 2


def test_cp_one_hands_the_whole_row():
    pipeline = _pipeline(cp=1)
    first = next(pipeline.micro_batches(0))
    assert first.cp_positions is None and first.tokens.shape[1] == first.row_length


def test_cp_settings_the_layout_cannot_split_are_refused():
    with pytest.raises(ValueError, match="cp 2 needs layout thd"):
        _pipeline(cp=2, layout="bshd")
    with pytest.raises(ValueError, match="cp 2 needs layout thd and sequences padded to a multiple of 2 x cp"):
        _pipeline(cp=2, multiple=2)
    with pytest.raises(ValueError, match="cp_rank 2 is outside"):
        _pipeline(cp=2).micro_batches(0, 0, cp_rank=2)
