"""The in-memory weight syncs' packing (buckets.py) on CPU tensors: what a vLLM worker reads back from a bucket is
every tensor, bit for bit, in bf16, and no bucket holds more than its size unless one tensor does. The broadcast
sends these buckets over gloo in tests/runtime/rl/test_rl_vllm.py; sharing them through CUDA IPC needs CUDA
(tests/gpu/test_rl_vllm_gpu.py)."""

from __future__ import annotations

import torch

from gdnctl.runtime.rl.weights import buckets as packing


def _tensors():
    generator = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(300, 64, generator=generator)),
        ("model.layers.0.linear_attn.A_log", torch.randn(5, generator=generator)),
        ("model.layers.0.mlp.experts.0.up_proj.weight", torch.randn(96, 64, generator=generator)),
        ("model.norm.weight", torch.randn(64, generator=generator, dtype=torch.float64)),
    ]


def test_buckets_carry_every_tensor_exactly_in_bf16():
    sent = _tensors()
    received = [pair for bucket in packing.buckets(sent, bucket_bytes=16 << 10) for pair in bucket.tensors()]
    assert [name for name, _ in received] == [name for name, _ in sent]
    for (_, original), (_, copy) in zip(sent, received, strict=True):
        assert copy.dtype == torch.bfloat16 and copy.shape == original.shape
        assert torch.equal(copy, original.to(torch.bfloat16))


def test_buckets_respect_their_size_except_for_a_larger_tensor():
    sent = _tensors()
    bucket_bytes = 16 << 10  # the embedding (300 x 64 bf16 = 37.5 KiB) is larger and travels alone
    packed = list(packing.buckets(sent, bucket_bytes=bucket_bytes))
    assert [[entry.name for entry in bucket.entries] for bucket in packed] == [
        ["model.embed_tokens.weight"],
        ["model.layers.0.linear_attn.A_log", "model.layers.0.mlp.experts.0.up_proj.weight", "model.norm.weight"],
    ]
    assert packed[1].buffer.numel() <= bucket_bytes
    for bucket in packed:
        assert all(entry.offset % 256 == 0 for entry in bucket.entries)  # every view aligned


def test_one_bucket_when_everything_fits():
    (bucket,) = packing.buckets(_tensors())
    assert len(bucket.entries) == 4 and bucket.buffer.dtype == torch.uint8


def test_a_receiver_rebuilds_the_tensors_from_the_wire_entries_alone():
    """What a worker gets: the raw buffer and the entries as tuples (how they cross vLLM's RPC)."""
    (bucket,) = packing.buckets(_tensors())
    received = packing.copies(bucket.buffer.clone(), packing.entries_from_wire(bucket.wire_entries()))
    assert [(name, tensor.shape) for name, tensor in received] == [(n, t.shape) for n, t in bucket.tensors()]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(received, bucket.tensors(), strict=True))
