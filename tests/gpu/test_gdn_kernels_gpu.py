"""FLA and FlashQLA, called through gdnctl's adapter, against the fp32 reference at Qwen3.5-35B-A3B GDN shapes.

Forward output and all input gradients must stay within 1e-2 relative error (||a - b|| / ||b||). FlashQLA
compiles its TileLang kernels on first use (minutes per head configuration); set TILELANG_CACHE_DIR to keep them.
"""

from __future__ import annotations

import pytest
import torch

from gdnctl.knowledge import GDN_BACKENDS
from gdnctl.runtime.kernels.backends import GdnBackendUnavailable, resolve_backend
from gdnctl.runtime.kernels.reference import GdnShape, make_gdn_inputs, parity_errors

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOLERANCE = 1e-2

# Qwen3.5-35B-A3B GDN: 16 q/k heads and 32 v heads of dim 128, split over tensor-parallel ranks.
SHAPES = [
    GdnShape("tp1-1x8192", qk_heads=16, v_heads=32, seq_lens=(8192,), packed=False),
    GdnShape("tp2-1x8192", qk_heads=8, v_heads=16, seq_lens=(8192,), packed=False),
    GdnShape("tp1-varlen-4", qk_heads=16, v_heads=32, seq_lens=(1500, 2548, 3000, 1144), packed=True),
]


@pytest.fixture(scope="module", params=list(GDN_BACKENDS))
def kernel(request):
    try:
        return resolve_backend(request.param, training=True)
    except GdnBackendUnavailable as unavailable:
        pytest.skip(str(unavailable))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.name)
def test_forward_and_gradients_match_the_fp32_reference(kernel, shape):
    errors = parity_errors(kernel, make_gdn_inputs(shape, device="cuda"))
    print(f"{kernel.name} {shape.name}: " + " ".join(f"{name}={error:.2e}" for name, error in errors.items()))
    assert max(errors.values()) <= TOLERANCE, errors


def test_flashqla_chunk_metadata_from_the_host_copy_is_what_it_reads_back_from_the_gpu():
    """What the adapter attaches to packed offsets for FlashQLA (flash-qla 0.1.3's prepare_varlen_metadata, from
    the host copy) is what its kernels otherwise compute on the GPU and read back (an empty document included)."""
    index = pytest.importorskip("flash_qla.utils.index")
    from flash_qla.ops.gated_delta_rule.chunk import CHUNK_SIZE

    host = torch.tensor([0, 1, 65, 65, 300, 1000, 8192], dtype=torch.int32)
    attached = index.prepare_varlen_metadata(host.cuda(), host)
    offsets, count = index.prepare_chunk_offsets(attached, CHUNK_SIZE)
    read_back, read_count = index._fallback_prepare_chunk_offsets(host.cuda(), CHUNK_SIZE)
    assert torch.equal(offsets, read_back) and count == read_count
    indices = index.prepare_chunk_indices(attached, CHUNK_SIZE)
    assert torch.equal(indices, index._fallback_prepare_chunk_indices(host.cuda(), CHUNK_SIZE))
