"""An fp32 pure-torch chunked gated delta rule: the yardstick the FLA and FlashQLA kernels are checked against.

Recurrence per value head (state S is K x V, g in log space, beta in (0, 1)):

    S_t = exp(g_t) S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - (exp(g_t) S_{t-1})^T k_t),   o_t = scale S_t^T q_t

Inside a chunk of C tokens with gamma = cumsum(g) and start state S0 this unrolls to a unit lower-triangular
system, solved in one batched call instead of C sequential steps:

    (I + A) U = beta * (V - exp(gamma) K S0),   A[t, s] = beta_t exp(gamma_t - gamma_s) k_t . k_s   (s < t)
    O = scale (exp(gamma) Q S0 + (Q K^T * D) U),  D[t, s] = exp(gamma_t - gamma_s)   (s <= t)
    S_C = exp(gamma_C) S0 + (K * exp(gamma_C - gamma))^T U

Everything is differentiable, so autograd gives the reference gradients. Grouped value heads: value head j
reads q/k head j // (HV // H), the layout Megatron-Core produces with `repeat_interleave`.

`parity_errors(kernel, make_gdn_inputs(shape, ...))` measures a kernel against this reference; the GPU tests,
the kernel benchmark and on-cluster checks share it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DEFAULT_CHUNK_SIZE = 64


def gated_delta_rule_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule in fp32, with the kernels' layout and arguments.

    q, k: [B, T, H, K]; v: [B, T, HV, V] with HV a multiple of H; g, beta: [B, T, HV]; g in log space.
    With `cu_seqlens` ([N + 1] offsets) the batch must be 1 and holds N packed sequences.
    initial_state: [N, HV, K, V] (N = B without `cu_seqlens`). Returns o [B, T, HV, V] in fp32 and, when
    `output_final_state`, the fp32 final states [N, HV, K, V].
    """
    _check_shapes(q, k, v, g, beta, cu_seqlens)
    group = v.shape[2] // q.shape[2]
    q, k = (x.float().repeat_interleave(group, dim=2) for x in (q, k))
    v, g, beta = v.float(), g.float(), beta.float()
    scale = q.shape[-1] ** -0.5 if scale is None else scale

    if cu_seqlens is None:
        o, final_state = _run_sequences(q, k, v, g, beta, scale, initial_state, chunk_size)
        return o, final_state if output_final_state else None

    outputs, final_states = [], []
    offsets = cu_seqlens.tolist()
    for index, (start, end) in enumerate(zip(offsets[:-1], offsets[1:], strict=True)):
        tokens = slice(start, end)
        state = None if initial_state is None else initial_state[index : index + 1]
        o, final_state = _run_sequences(
            q[:, tokens], k[:, tokens], v[:, tokens], g[:, tokens], beta[:, tokens], scale, state, chunk_size
        )
        outputs.append(o)
        final_states.append(final_state)
    return torch.cat(outputs, dim=1), torch.cat(final_states) if output_final_state else None


def _check_shapes(q, k, v, g, beta, cu_seqlens) -> None:
    if q.shape != k.shape:
        raise ValueError(f"q and k must have one shape, got {tuple(q.shape)} and {tuple(k.shape)}.")
    if v.shape[:2] != q.shape[:2] or v.shape[2] % q.shape[2] != 0:
        raise ValueError(
            f"v {tuple(v.shape)} must share batch and length with q {tuple(q.shape)} and have a multiple of its heads."
        )
    if g.shape != v.shape[:3] or beta.shape != v.shape[:3]:
        raise ValueError(f"g {tuple(g.shape)} and beta {tuple(beta.shape)} must be [B, T, HV] = {tuple(v.shape[:3])}.")
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(f"Packed sequences (cu_seqlens) need batch 1, got {q.shape[0]}.")


def _run_sequences(q, k, v, g, beta, scale, initial_state, chunk_size):
    """Equal-length sequences batched on dim 0, heads already expanded: [N, T, HV, D] in, [N, T, HV, V] out."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [N, HV, T, D]
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)  # [N, HV, T]
    batch, heads, length, key_dim = k.shape
    state = q.new_zeros(batch, heads, key_dim, v.shape[-1]) if initial_state is None else initial_state.float()
    outputs = []
    for start in range(0, length, chunk_size):
        tokens = slice(start, start + chunk_size)
        o, state = _chunk(
            q[:, :, tokens] * scale, k[:, :, tokens], v[:, :, tokens], g[:, :, tokens], beta[:, :, tokens], state
        )
        outputs.append(o)
    return torch.cat(outputs, dim=2).transpose(1, 2), state


def _chunk(q, k, v, g, beta, state):
    """One chunk for all sequences and heads at once: q already scaled; returns (o, state after the chunk)."""
    size = k.shape[-2]
    gamma = g.cumsum(-1)  # [N, HV, C]
    causal = torch.ones(size, size, dtype=torch.bool, device=k.device).tril()
    # Mask before exp: above the diagonal gamma_t - gamma_s is positive and can overflow to inf (inf * 0 = nan).
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    start_decay = gamma.exp()[..., None]  # exp(gamma_t): how much of S0 survives to token t

    strictly_lower = ((k @ k.transpose(-1, -2)) * decay).tril(-1) * beta[..., :, None]
    rhs = beta[..., None] * (v - (k * start_decay) @ state)
    # unitriangular: the solver takes the diagonal as 1, i.e. solves (I + strictly_lower) U = rhs.
    u = torch.linalg.solve_triangular(strictly_lower, rhs, upper=False, unitriangular=True)

    o = (q * start_decay) @ state + ((q @ k.transpose(-1, -2)) * decay) @ u
    total = gamma[..., -1:]  # [N, HV, 1]
    state = state * total.exp()[..., None] + (k * (total - gamma).exp()[..., None]).transpose(-1, -2) @ u
    return o, state


# --- Checking a kernel against the reference --------------------------------------------------------------------


@dataclass(frozen=True)
class GdnShape:
    """One GDN kernel call: sequences of `seq_lens` tokens, packed in one row with cu_seqlens or one row each."""

    name: str
    qk_heads: int
    v_heads: int
    seq_lens: tuple[int, ...]
    packed: bool
    head_dim: int = 128

    def __post_init__(self):
        if not self.packed and len(set(self.seq_lens)) != 1:
            raise ValueError(f"{self.name}: unpacked sequences share one length, got {self.seq_lens}.")


def make_gdn_inputs(
    shape: GdnShape, *, device: str | torch.device, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> dict[str, torch.Tensor | None]:
    """Inputs as Megatron-Core hands them to the kernel: l2-normed q/k, fp32 log-space g, sigmoid beta."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def normal(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator, device=device, dtype=torch.float32)

    batch, length = (1, sum(shape.seq_lens)) if shape.packed else (len(shape.seq_lens), shape.seq_lens[0])
    dim = shape.head_dim
    q = F.normalize(normal(batch, length, shape.qk_heads, dim), dim=-1).to(dtype)
    k = F.normalize(normal(batch, length, shape.qk_heads, dim), dim=-1).to(dtype)
    v = normal(batch, length, shape.v_heads, dim).to(dtype)
    # Megatron's gate g = -exp(A_log) * softplus(alpha + dt_bias) with A in its init range [1, 16). Its dt_bias
    # init (1) forgets within a few tokens, which would hide state errors; a Mamba-style dt_bias with
    # softplus(dt_bias) in [1e-3, 1e-1) gives heads from slow to fast decay, so the state carries far.
    uniform = torch.rand(2, shape.v_heads, generator=generator, device=device)
    decay_rate = 1 + 15 * uniform[0]
    dt = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * uniform[1])
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    alpha = normal(batch, length, shape.v_heads).to(dtype)
    g = -decay_rate * F.softplus(alpha.float() + dt_bias)
    beta = normal(batch, length, shape.v_heads).to(dtype).sigmoid()
    cu_seqlens = None
    if shape.packed:
        offsets = [0, *itertools.accumulate(shape.seq_lens)]
        cu_seqlens = torch.tensor(offsets, dtype=torch.int32, device=device)  # Megatron's PackedSeqParams dtype
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "cu_seqlens": cu_seqlens}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in fp64 (Frobenius norms)."""
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).norm() / expected.norm()).item()


GRADIENT_INPUTS = ("q", "k", "v", "g", "beta")


def parity_errors(kernel: Callable, inputs: Mapping[str, torch.Tensor | None], *, seed: int = 1) -> dict[str, float]:
    """Relative errors of `kernel`'s o, dq, dk, dv, dg, dbeta against the fp32 reference, for one upstream
    gradient drawn with `seed`. `kernel` takes Megatron-Core's call (a GdnKernel or a raw kernel)."""
    tensors = [inputs[name] for name in GRADIENT_INPUTS]
    cu_seqlens = inputs["cu_seqlens"]
    generator = torch.Generator(device=tensors[0].device).manual_seed(seed)
    upstream = torch.randn(inputs["v"].shape, generator=generator, device=tensors[0].device).to(inputs["v"].dtype)

    leaves = [tensor.detach().clone().requires_grad_(True) for tensor in tensors]
    o, _ = kernel(*leaves[:3], g=leaves[3], beta=leaves[4], cu_seqlens=cu_seqlens)
    o.backward(upstream)
    reference_leaves = [tensor.detach().float().requires_grad_(True) for tensor in tensors]
    o_reference, _ = gated_delta_rule_reference(*reference_leaves, cu_seqlens=cu_seqlens)
    o_reference.backward(upstream.float())

    errors = {"o": relative_error(o, o_reference)}
    for name, leaf, reference_leaf in zip(GRADIENT_INPUTS, leaves, reference_leaves, strict=True):
        errors[f"d{name}"] = relative_error(leaf.grad, reference_leaf.grad)
    return errors
