"""Weight-gradient accumulation fusion in Transformer Engine's layers, with or without APEX.

With `gradient_accumulation_fusion`, TE's linears add each weight gradient straight into the fp32/bf16 gradient
buffer of Megatron's DDP (`fuse_wgrad_accumulation`) instead of writing a gradient tensor that a hook then adds
in a second pass. TE does this with its own GEMM; only Megatron-Core's non-TE linears need APEX's
`fused_weight_gradient_mlp_cuda` for it. Megatron-Core 0.19.2 checks for APEX when any ColumnParallelLinear is
built with the option on (megatron/core/tensor_parallel/layers.py, `_grad_accum_fusion_available`, checked in
ColumnParallelLinear.__init__), and in a model built from Transformer Engine's spec that class is only the output
layer. So without APEX: build with the option on, then put the non-TE linears back on their unfused path, where
DDP's hook accumulates their gradients as it always does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def apex_fused_wgrad_available() -> bool:
    import megatron.core.tensor_parallel.layers as layers

    return bool(layers._grad_accum_fusion_available)


@contextlib.contextmanager
def building_with_wgrad_fusion() -> Iterator[None]:
    """While the model is built: Megatron-Core's build-time APEX check passes (restored afterwards)."""
    import megatron.core.tensor_parallel.layers as layers

    before = layers._grad_accum_fusion_available
    layers._grad_accum_fusion_available = True
    try:
        yield
    finally:
        layers._grad_accum_fusion_available = before


def unfuse_non_te_linears(model: Any) -> list[str]:
    """Turn the fusion off in every Megatron-Core (non-TE) linear of `model`; returns their names. Their forward
    reads the instance attribute, so the weight gradient is computed unfused and DDP's hook adds it."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    changed = []
    for name, module in model.named_modules():
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear)) and module.gradient_accumulation_fusion:
            module.gradient_accumulation_fusion = False
            changed.append(name)
    return changed
