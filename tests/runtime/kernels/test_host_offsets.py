"""Packed offsets the GDN layers read on the host (runtime/kernels/host_offsets.py): the device tensor carries its
host copy, the checks are Megatron-Core 0.19.2's own with its messages, and a megatron-core without that method
is left as it is. (The replacement inside megatron-core 0.19.2's GatedDeltaNet runs in the GPU test of the proxy on
packed rows, tests/gpu/test_proxy_packed_gpu.py.)"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from gdnctl.runtime.kernels import host_copy, install_host_side_checks, with_host_copy
from gdnctl.runtime.kernels.backends import GdnKernel
from gdnctl.runtime.kernels.host_offsets import check_offsets


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent that is a module, not a package (megatron-core < 0.19's gated_delta_net)
        return False


def test_the_device_tensor_carries_its_host_copy():
    host = torch.tensor([0, 3, 8], dtype=torch.int32)
    device = with_host_copy(host.clone(), host)
    assert host_copy(device) is host
    assert host_copy(torch.tensor([0, 3])) is None and host_copy(None) is None


def test_checks_pass_on_consistent_offsets():
    check_offsets(torch.tensor([0, 4, 8, 16]), 16, "cu_seqlens_q", 2)


def test_a_total_that_does_not_match_the_row_is_refused_with_megatrons_message():
    with pytest.raises(ValueError, match=r"GDN: cu_seqlens_q\[-1\]=12 does not match total_sequence_length=16"):
        check_offsets(torch.tensor([0, 4, 12]), 16, "cu_seqlens_q", 1)


def test_lengths_not_divisible_by_cp_are_refused_with_megatrons_message():
    with pytest.raises(ValueError, match=r"divisible by cp_size=2, but got lengths: \[3, 5\]"):
        check_offsets(torch.tensor([0, 3, 8]), 8, "cu_seqlens_q", 2)


@pytest.mark.skipif(
    not _has_module("megatron.core") or _has_module("megatron.core.ssm.gated_delta_net.common"),
    reason="needs a megatron-core without the 0.19 GDN package (the test extra's 0.16); 0.19's "
    "method is replaced in the GPU test",
)
def test_a_megatron_core_without_the_gdn_package_is_left_as_it_is():
    assert "left as it is" in install_host_side_checks()


def test_the_kernel_adapter_hands_fla_the_host_copy():
    seen = {}

    def kernel(
        q,
        k,
        v,
        g,
        beta,
        *,
        scale=None,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=None,
        cu_seqlens_cpu=None,
    ):
        seen["cu_seqlens_cpu"] = cu_seqlens_cpu
        return v, None

    host = torch.tensor([0, 2, 4], dtype=torch.int32)
    x = torch.zeros(1, 4, 1, 2)
    GdnKernel("fla", kernel)(x, x, x, x[..., 0], x[..., 0], cu_seqlens=with_host_copy(host.clone(), host))
    assert seen["cu_seqlens_cpu"] is host
    GdnKernel("fla", kernel)(x, x, x, x[..., 0], x[..., 0], cu_seqlens=host.clone())
    assert seen["cu_seqlens_cpu"] is None


def _kernel_without_host_offsets(
    q,
    k,
    v,
    g,
    beta,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
):
    """FlashQLA's signature: no cu_seqlens_cpu."""
    return v, None


def test_a_kernel_without_the_option_is_not_handed_it():
    host = torch.tensor([0, 4], dtype=torch.int32)
    x = torch.zeros(1, 4, 1, 2)
    out, _ = GdnKernel("flashqla", _kernel_without_host_offsets)(
        x, x, x, x[..., 0], x[..., 0], cu_seqlens=with_host_copy(host.clone(), host)
    )
    assert out.shape == x.shape


def test_flashqla_gets_its_chunk_metadata_from_the_host_copy_once_per_offsets_tensor(monkeypatch):
    """flash-qla 0.1.3's prepare_varlen_metadata(cu_seqlens, cu_seqlens_cpu) attaches what the kernels would
    otherwise read back from the GPU; the adapter calls it once per offsets tensor, only where a host copy exists."""
    from gdnctl.runtime.kernels import backends

    calls = []

    def prepare_varlen_metadata(cu_seqlens, cu_seqlens_cpu):
        calls.append((cu_seqlens, cu_seqlens_cpu))
        setattr(cu_seqlens, backends._FLASHQLA_METADATA, ("chunk size", "offsets", "count", "indices"))
        return cu_seqlens

    monkeypatch.setattr(backends, "_flashqla_varlen_metadata", lambda: prepare_varlen_metadata)

    fused = GdnKernel("flashqla", _kernel_without_host_offsets)
    host = torch.tensor([0, 3, 4], dtype=torch.int32)
    offsets = with_host_copy(host.clone(), host)
    x = torch.zeros(1, 4, 1, 2)
    for _ in range(3):  # the layers of one micro-batch share its offsets
        fused(x, x, x, x[..., 0], x[..., 0], cu_seqlens=offsets)
    assert len(calls) == 1 and calls[0][0] is offsets and calls[0][1] is host
    fused(x, x, x, x[..., 0], x[..., 0], cu_seqlens=torch.tensor([0, 4], dtype=torch.int32))  # no host copy
    assert len(calls) == 1
    GdnKernel("fla", _kernel_without_host_offsets)(
        x, x, x, x[..., 0], x[..., 0], cu_seqlens=with_host_copy(host.clone(), host)
    )
    assert len(calls) == 1  # FLA takes the host copy itself
