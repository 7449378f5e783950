"""Timing a GDN kernel's first and warm calls at one rank's shape.

The trainer calls each per-rank shape once before step 1 (so TileLang's compile is not billed to a step), and
`gdnctl prewarm` / `doctor` use the same timing to show what a warm cache is worth.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gdnctl.knowledge import RankShape


@dataclass(frozen=True)
class ShapeTiming:
    shape: str
    first_call_s: float
    warm_call_s: float


def fwd_bwd_seconds(kernel, shape: RankShape) -> float:
    import torch

    from gdnctl.runtime.kernels.reference import GdnShape, make_gdn_inputs

    inputs = make_gdn_inputs(
        GdnShape(shape.name, shape.qk_heads, shape.v_heads, shape.seq_lens, shape.packed, shape.head_dim), device="cuda"
    )
    leaves = [inputs[n].detach().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")]
    torch.cuda.synchronize()
    start = time.perf_counter()
    out, _ = kernel(*leaves[:3], g=leaves[3], beta=leaves[4], cu_seqlens=inputs["cu_seqlens"])
    out.sum().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def time_shapes(shapes: list[RankShape], progress: Callable[[str], None] | None = None, *, kernel) -> list[ShapeTiming]:
    """First and second forward+backward call per shape of `kernel` (a GdnKernel), in this process, with a
    progress line per kernel the first call compiles where its backend shows compile progress (FlashQLA: TileLang
    says which; FLA's Triton compiles say nothing, so the first call's time is all there is)."""
    import contextlib

    from gdnctl.runtime.kernels.compile_progress import expected_kernels, watch_compiles

    timings = []
    for index, shape in enumerate(shapes, 1):
        if progress:
            progress(
                f"[{index}/{len(shapes)}] {shape.name}: {shape.qk_heads} q/k heads, {shape.v_heads} v heads, "
                f"{shape.tokens} tokens{' packed' if shape.packed else ''}"
            )
        watching = (
            watch_compiles(shape.name, expected_kernels(shape.qk_heads, shape.v_heads), progress)
            if kernel.shows_compile_progress
            else contextlib.nullcontext()
        )
        with watching:
            first = fwd_bwd_seconds(kernel, shape)
        warm = min(fwd_bwd_seconds(kernel, shape) for _ in range(3))
        timings.append(ShapeTiming(shape.name, round(first, 4), round(warm, 4)))
        if progress:
            progress(f"      first call {first:.2f} s, warm call {warm * 1000:.1f} ms")
    return timings
