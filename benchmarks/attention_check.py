"""Qwen3.5's full attention (16 query / 2 KV heads of dim 256, causal, bf16) through each core attention gdnctl can
run, against a per-sequence fp32 SDPA reference: relative error of the output and of dQ, dK, dV, non-finite counts,
and fwd+bwd time on one packed row.

    python benchmarks/attention_check.py [--trials 10] [--out attention.json]

Backends: Transformer Engine's DotProductAttention in THD (packed rows, the trainer's cu_seqlens) and SBHD (full rows)
with whatever backend TE selects here (set NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 to see which), torch's varlen
FlashAttention and per-sequence SDPA (gdnctl's TorchCoreAttention). Rows are packed as the trainer packs synthetic
documents: lengths log-uniform between 1/8 of 8192 and 8192, first fit. Needs a CUDA GPU; TE is optional.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import torch
import torch.nn.functional as F

try:  # imported before any CUDA work: TE loads its own cuDNN, which must not meet the one torch has already loaded
    from transformer_engine.pytorch import DotProductAttention
except ImportError:
    DotProductAttention = None

HEADS, KV_HEADS, HEAD_DIM, ROW = 16, 2, 256, 8192
BAD_RELATIVE_ERROR = 0.05  # bf16 against fp32 measures ~0.003 for a correct kernel


def packed_rows(count: int, rng: random.Random) -> list[list[int]]:
    rows = []
    for _ in range(count):
        lengths, room = [], ROW
        while room >= ROW // 8:
            length = int(math.exp(rng.uniform(math.log(ROW // 8), math.log(ROW + 1))))
            if length > room:
                break
            lengths.append(length)
            room -= length
        rows.append(lengths)
    return rows


def reference(q, k, v, lengths):
    outputs, start = [], 0
    for length in lengths:
        qq, kk, vv = (t[start : start + length].float().transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True)
        outputs.append(out[0].transpose(0, 1).reshape(length, -1))
        start += length
    return torch.cat(outputs)


def backends(lengths):
    """name -> fn(q, k, v) -> [t, heads*d] for packed q [t, heads, d], k/v [t, kv_heads, d]."""
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    longest, total = max(lengths), sum(lengths)
    calls = {}
    if DotProductAttention is not None:
        thd = DotProductAttention(
            HEADS,
            HEAD_DIM,
            num_gqa_groups=KV_HEADS,
            attn_mask_type="padding_causal",
            qkv_format="thd",
            attention_dropout=0.0,
        )
        sbhd = DotProductAttention(
            HEADS, HEAD_DIM, num_gqa_groups=KV_HEADS, attn_mask_type="causal", qkv_format="sbhd", attention_dropout=0.0
        )
        calls["te_thd"] = lambda q, k, v: thd(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest
        )

        def te_sbhd(q, k, v):  # one full row per sequence, as BSHD batches them
            outs, start = [], 0
            for length in lengths:
                part = [t[start : start + length].unsqueeze(1).contiguous() for t in (q, k, v)]
                outs.append(sbhd(*part).reshape(length, -1))
                start += length
            return torch.cat(outs)

        calls["te_sbhd"] = te_sbhd
    from megatron.core.packed_seq_params import PackedSeqParams

    from gdnctl.runtime.model.core_attention import TorchCoreAttention

    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu,
        cu_seqlens_kv_padded=cu,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )
    torch_attention = TorchCoreAttention.__new__(TorchCoreAttention)
    torch.nn.Module.__init__(torch_attention)
    torch_attention.softmax_scale = None
    calls["torch_varlen"] = lambda q, k, v: torch_attention._packed(q, k, v, params).reshape(total, -1)
    return calls


def measure(fn, q0, k0, v0, grad, want, repeat: int = 10) -> dict:
    q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
    out = fn(q, k, v)
    out.backward(grad)
    got = (out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float())
    row = {}
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        row[name] = {"nonfinite": int((~torch.isfinite(a)).sum()), "rel_err": float((a - b).norm() / b.norm())}
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(grad)
    torch.cuda.synchronize()
    row["ms_fwd_bwd"] = (time.perf_counter() - start) / repeat * 1e3
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    results: dict = {"trials": [], "summary": {}}
    for lengths in packed_rows(args.trials, rng):
        total = sum(lengths)
        q0 = torch.randn(total, HEADS, HEAD_DIM, device="cuda").bfloat16()
        k0, v0 = (torch.randn(total, KV_HEADS, HEAD_DIM, device="cuda").bfloat16() for _ in range(2))
        grad = torch.randn(total, HEADS * HEAD_DIM, device="cuda").bfloat16()
        q, k, v = (t.float().requires_grad_() for t in (q0, k0, v0))
        out = reference(q, k, v, lengths)
        out.backward(grad.float())
        want = (out.detach(), q.grad, k.grad, v.grad)
        trial = {"lengths": lengths}
        for name, fn in backends(lengths).items():
            try:
                trial[name] = measure(fn, q0, k0, v0, grad, want)
            except Exception as error:  # a backend that refuses this shape is a result, not a crash
                trial[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        results["trials"].append(trial)
        print(json.dumps(trial), flush=True)
    names = sorted({name for trial in results["trials"] for name in trial if name != "lengths"})
    for name in names:
        rows = [t[name] for t in results["trials"] if "error" not in t.get(name, {"error": 1})]
        results["summary"][name] = {
            "trials": len(rows),
            "wrong": sum(
                any(r[g]["nonfinite"] or not r[g]["rel_err"] <= BAD_RELATIVE_ERROR for g in ("out", "dq", "dk", "dv"))
                for r in rows
            ),
            "max_rel_err": {g: max((r[g]["rel_err"] for r in rows), default=None) for g in ("out", "dq", "dk", "dv")},
            "median_ms_fwd_bwd": sorted(r["ms_fwd_bwd"] for r in rows)[len(rows) // 2] if rows else None,
        }
    print("SUMMARY " + json.dumps(results["summary"]), flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
