"""Packed-row offsets that the GDN layers read on the host, so a packed micro-batch makes no GPU-to-host copy.

Megatron-Core 0.19.2's GatedDeltaNet checks the packed offsets of every micro-batch in every layer on the host:
`_resolve_cu_seqlens` (megatron/core/ssm/gated_delta_net/common.py, line 457: `cu_seqlens[-1].cpu().item()`, and
the `.any()` of the divisibility check beside it) runs twice per layer and forward, each a device synchronisation:
96 of the ~174 synchronisations of one 35B-A3B proxy step (6 GDN layers x 4 micro-batches x 4) on an H100. FLA's
kernel builds its chunk index from the offsets the same way unless given a host copy (`cu_seqlens_cpu`,
fla/ops/utils/index.py `prepare_chunk_indices`). A synchronisation stops the host from queueing the next kernels
while the GPU drains, so each costs the launch latency of what follows.

The trainer builds the offsets on the host anyway (runtime/data/pipeline.py), so it hands the layers both: the
device tensor carries its host copy as an attribute. The same checks then run on the host copy, with
Megatron-Core's own error messages; a tensor without a host copy (built elsewhere) takes Megatron-Core's path.
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by backends.py, which must load where torch is missing
    import torch

_HOST_COPY = "_gdnctl_host_offsets"
_GDN_COMMON = "megatron.core.ssm.gated_delta_net.common"
# The signature gdnctl's replacement keeps (megatron-core 0.19.2); another one means another contract.
_RESOLVE_PARAMETERS = ("self", "cu_seqlens_padded", "cu_seqlens_actual", "total_seq_len", "name", "cp_size")


def with_host_copy(device_offsets: torch.Tensor, host_offsets: torch.Tensor) -> torch.Tensor:
    """`device_offsets`, carrying `host_offsets` (the same values, on the CPU) for the GDN layers."""
    setattr(device_offsets, _HOST_COPY, host_offsets)
    return device_offsets


def host_copy(offsets: torch.Tensor | None) -> torch.Tensor | None:
    return None if offsets is None else getattr(offsets, _HOST_COPY, None)


def install_host_side_checks() -> str:
    """Make Megatron-Core's GDN layers check packed offsets on their host copy; returns what was done, a line for
    the trainer's log. Leaves a megatron-core whose GDN has no such method, or another signature, as it is."""
    try:
        common = importlib.import_module(_GDN_COMMON)
    except ImportError:
        return "packed offsets: this megatron-core has no GDN common module, left as it is"
    owner = next(
        (cls for cls in vars(common).values() if isinstance(cls, type) and "_resolve_cu_seqlens" in vars(cls)), None
    )
    if owner is None:
        return "packed offsets: megatron-core's GDN has no _resolve_cu_seqlens, left as it is"
    original = vars(owner)["_resolve_cu_seqlens"]
    if getattr(original, "_gdnctl_host_side", False):
        return f"packed offsets: checked on the host in {owner.__name__}"
    if tuple(inspect.signature(original).parameters) != _RESOLVE_PARAMETERS:
        return (
            f"packed offsets: {owner.__name__}._resolve_cu_seqlens has another signature than megatron-core "
            "0.19.2's, left as it is"
        )

    def _resolve_cu_seqlens(self, cu_seqlens_padded, cu_seqlens_actual, total_seq_len, name, cp_size: int = 1):
        offsets = cu_seqlens_padded if cu_seqlens_padded is not None else cu_seqlens_actual
        host = host_copy(offsets)
        if host is None:
            return original(self, cu_seqlens_padded, cu_seqlens_actual, total_seq_len, name, cp_size)
        check_offsets(host, total_seq_len, name, cp_size)
        return offsets

    _resolve_cu_seqlens._gdnctl_host_side = True
    _resolve_cu_seqlens.__doc__ = original.__doc__
    owner._resolve_cu_seqlens = _resolve_cu_seqlens
    return f"packed offsets: checked on the host in {owner.__name__} (no device synchronisation per layer)"


def check_offsets(host: torch.Tensor, total_seq_len: int, name: str, cp_size: int) -> None:
    """Megatron-Core 0.19.2's two checks of `_resolve_cu_seqlens`, with its messages, on the host copy."""
    total = int(host[-1])
    if total != total_seq_len:
        raise ValueError(f"GDN: {name}[-1]={total} does not match total_sequence_length={total_seq_len}.")
    lengths = host[1:] - host[:-1]
    if bool((lengths % cp_size != 0).any()):
        raise ValueError(
            f"All per-sequence lengths in cu_seqlens must be divisible by cp_size={cp_size}, "
            f"but got lengths: {lengths.tolist()}"
        )
