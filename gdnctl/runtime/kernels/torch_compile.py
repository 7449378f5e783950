"""Whether the trainer process runs torch.compile'd functions compiled or eagerly (kernels.torch_compile).

Megatron-Core decorates its fused elementwise functions with torch.compile (megatron/core/jit.py `jit_fuser`: the
GDN gate, norm and g/beta functions, the attention output gate, the fused cross entropy), Transformer Engine
compiles its ops fuser, and FLA its l2norm. No cache on disk spares dynamo's tracing of them in each new process,
and every new packed length recompiles them. Measured on an H100 (BENCHMARKS.md, "Trainer: step 1 and memory"), with
warm compiler caches: step 1 of the tiny preset 5.06 s compiled vs 1.10 s eager (TE-free) and 12.1 s vs 4.85 s
(megatron-bridge); on the 35B-A3B proxy (megatron-bridge) 18.3 s vs 13.7 s, steady steps alike, and a 6.3 GiB lower
peak eager.

force_eager is torch's own switch (torch.compiler.set_stance): it acts at call time, so it holds for functions
decorated before this runs, and it stays in this process: the rollout server's vLLM compiles as it chooses.
"""

from __future__ import annotations


def apply_torch_compile(enabled: bool) -> str:
    """Set this process's torch.compile stance; returns the sentence the trainer logs."""
    if enabled:
        return "torch.compile: on (kernels.torch_compile: true): fused functions are traced and compiled per process"
    import torch

    torch.compiler.set_stance("force_eager")
    return ("torch.compile: off (kernels.torch_compile: false): Megatron-Core's, Transformer Engine's and FLA's "
            "compiled functions run eagerly")
