"""Whether the trainer process runs torch.compile'd functions compiled or eagerly (kernels.torch_compile).

Megatron-Core decorates its fused elementwise functions with torch.compile (megatron/core/jit.py `jit_fuser`: the
GDN gate, norm and g/beta functions, the attention output gate, the fused cross entropy), Transformer Engine
compiles its ops fuser, and FLA its l2norm. No cache on disk spares dynamo's tracing of them in each new process,
and a new shape recompiles them. The plan decides (plan/decisions.py torch_compile). The measurements behind it:
on an H200 with the megatron-bridge builder and filled rows (benchmarks/results/step-profile-h200-2026-11-26.md),
compiled, the 35B-A3B proxy's elementwise kernels took 50 ms of GPU time a step instead of 170 ms, the step 0.776 s
instead of 0.821 s and the peak 49.59 GiB instead of 50.84 GiB, for about 3 s more of step 1 with warm caches. On
the TE-free builder (an H100, benchmarks/results/step1-memory-h100-2026-11-24.md) compiling only lengthened step 1
(the tiny preset's 5.06 s against 1.10 s eager).

force_eager is torch's own switch (torch.compiler.set_stance): it acts at call time, so it holds for functions
decorated before this runs, and it stays in this process: the rollout server's vLLM compiles as it chooses.
"""

from __future__ import annotations


def apply_torch_compile(enabled: bool, reason: str = "") -> str:
    """Set this process's torch.compile stance; returns the sentence the trainer logs, with the plan's reason."""
    why = f" ({reason})" if reason else ""
    if enabled:
        return f"torch.compile: on{why}: fused functions are traced and compiled per process"
    import torch

    torch.compiler.set_stance("force_eager")
    return f"torch.compile: off{why}: Megatron-Core's, Transformer Engine's and FLA's compiled functions run eagerly"
