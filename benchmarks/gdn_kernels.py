"""Parity and speed of the GDN kernels on one GPU: raw FLA, raw FlashQLA, and both through gdnctl's adapter.

    PYTHONPATH=. python benchmarks/gdn_kernels.py --out gdn_kernels.json [--shapes tp1-1x8192,...] [--parity-only]

For each shape it checks both adapters against the fp32 reference (o, dq, dk, dv, dg, dbeta; relative error
||a - b|| / ||b||), then times the training forward (inputs require grad) and forward+backward with
triton.testing.do_bench medians, and reports how much of FlashQLA's raw speedup over FLA survives the adapter
(target >= 95%). Results are written to --out after every shape, so a crash or timeout keeps what was measured.
FLA runs with FLA_FLASH_QLA=0: FLA 0.6.0 would otherwise hand its own calls to FlashQLA.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

os.environ["FLA_FLASH_QLA"] = "0"  # before fla can be imported: "raw FLA" must be FLA's own Triton kernels

import torch  # noqa: E402

from gdnctl.runtime.kernels.backends import GdnBackendUnavailable, resolve_backend  # noqa: E402
from gdnctl.runtime.kernels.reference import GdnShape, make_gdn_inputs, parity_errors  # noqa: E402

# Qwen3.5-35B-A3B GDN: 16 q/k heads and 32 v heads of dim 128, split over tensor-parallel ranks.
SHAPES = {
    shape.name: shape
    for shape in (
        GdnShape("tp1-1x8192", qk_heads=16, v_heads=32, seq_lens=(8192,), packed=False),
        GdnShape("tp2-1x8192", qk_heads=8, v_heads=16, seq_lens=(8192,), packed=False),
        GdnShape("tp1-8x4096-varlen", qk_heads=16, v_heads=32, seq_lens=(4096,) * 8, packed=True),
    )
}
PARITY_TOLERANCE = 1e-2
ADAPTER_RATIO_TARGET_PCT = 95.0
BACKEND_LABELS = {"fla": "FLA", "flashqla": "FlashQLA"}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def package_versions() -> dict[str, str | None]:
    found = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    for label, distribution in (
        ("triton", "triton"),
        ("fla", "fla-core"),
        ("flash_qla", "flash-qla"),
        ("tilelang", "tilelang"),
    ):
        try:
            found[label] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            found[label] = None
    return found


def training_call(kernel, inputs):
    """Megatron-Core's call, on fresh leaves that require grad; returns (forward, forward+backward, leaves)."""
    leaves = {name: inputs[name].detach().clone().requires_grad_(True) for name in ("q", "k", "v", "g", "beta")}
    upstream = torch.randn_like(inputs["v"])

    def forward():
        return kernel(
            leaves["q"],
            leaves["k"],
            leaves["v"],
            g=leaves["g"],
            beta=leaves["beta"],
            initial_state=None,
            output_final_state=False,
            use_qk_l2norm_in_kernel=False,
            cu_seqlens=inputs["cu_seqlens"],
        )[0]

    def forward_backward():
        forward().backward(upstream)

    return forward, forward_backward, list(leaves.values())


def time_variants(variants, inputs, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per-round ms of each variant (do_bench median within a round); the variants take turns each round so
    clock drift and host jitter hit all of them alike."""
    import triton.testing

    samples = {name: {"fwd": [], "fwd_bwd": []} for name in variants}
    calls = {name: training_call(kernel, inputs) for name, kernel in variants.items()}
    for _ in range(rounds):
        for name, (forward, forward_backward, leaves) in calls.items():
            samples[name]["fwd"].append(triton.testing.do_bench(forward, return_mode="median"))
            samples[name]["fwd_bwd"].append(
                triton.testing.do_bench(forward_backward, grad_to_none=leaves, return_mode="median")
            )
    return samples


def medians(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    return {
        name: {mode: statistics.median(values) for mode, values in modes.items()} for name, modes in samples.items()
    }


def speedups(samples: dict[str, dict[str, list[float]]]) -> dict[str, float]:
    """FlashQLA over FLA, raw and through the adapter, and the adapter's share of the raw speedup in %.

    The share is taken per round (four timings measured back to back) and its median kept: pairing the
    timings within a round cancels drift that a ratio of whole-run medians would carry.
    """
    result = {}
    timings = medians(samples)
    for mode in ("fwd", "fwd_bwd"):
        result[f"raw_speedup_{mode}"] = timings["fla raw"][mode] / timings["flashqla raw"][mode]
        result[f"adapter_speedup_{mode}"] = timings["fla adapter"][mode] / timings["flashqla adapter"][mode]
        shares = [
            100 * (fla_a / fq_a) / (fla_r / fq_r)
            for fla_r, fla_a, fq_r, fq_a in zip(
                samples["fla raw"][mode],
                samples["fla adapter"][mode],
                samples["flashqla raw"][mode],
                samples["flashqla adapter"][mode],
                strict=True,
            )
        ]
        result[f"adapter_share_of_raw_pct_{mode}"] = statistics.median(shares)
        result[f"adapter_share_of_raw_pct_{mode}_quartiles"] = (
            statistics.quantiles(shares, n=4) if len(shares) > 1 else [shares[0]] * 3
        )
    return result


def run_shape(shape: GdnShape, kernels, parity_only: bool, rounds: int) -> dict:
    result = {
        "shape": {
            "qk_heads": shape.qk_heads,
            "v_heads": shape.v_heads,
            "seq_lens": list(shape.seq_lens),
            "packed": shape.packed,
            "head_dim": shape.head_dim,
        }
    }
    inputs = make_gdn_inputs(shape, device="cuda")
    result["parity"] = {}
    for name, kernel in kernels.items():
        started = time.perf_counter()
        errors = parity_errors(kernel, inputs)
        result["parity"][name] = errors
        log(
            f"{shape.name} parity {name} ({time.perf_counter() - started:.0f} s): "
            + " ".join(f"{key}={value:.2e}" for key, value in errors.items())
        )
    if parity_only:
        return result
    variants = {}
    for name, kernel in kernels.items():
        variants[f"{name} raw"] = kernel.raw_kernel
        variants[f"{name} adapter"] = kernel
    samples = time_variants(variants, inputs, rounds)
    result["timings_ms"] = medians(samples)
    result["timings_ms_per_round"] = samples
    for variant, modes in result["timings_ms"].items():
        log(f"{shape.name} {variant}: fwd {modes['fwd']:.3f} ms, fwd+bwd {modes['fwd_bwd']:.3f} ms")
    if len(kernels) == 2:
        result["speedups"] = speedups(samples)
    return result


def print_table(report: dict) -> None:
    print("\n| shape | kernel | fwd ms | fwd+bwd ms | max parity rel err |")
    print("|---|---|---|---|---|")
    for shape_name, result in report["shapes"].items():
        if "error" in result:
            print(f"| {shape_name} | failed: {result['error']} | | | |")
            continue
        for variant, modes in result.get("timings_ms", {}).items():
            backend = variant.split()[0]
            worst = max(result["parity"][backend].values())
            print(
                f"| {shape_name} | {BACKEND_LABELS[backend]} {variant.split()[1]} | {modes['fwd']:.3f} | "
                f"{modes['fwd_bwd']:.3f} | {worst:.1e} |"
            )
    for shape_name, result in report["shapes"].items():
        if "speedups" in result:
            s = result["speedups"]
            q1, _, q3 = s["adapter_share_of_raw_pct_fwd_bwd_quartiles"]
            print(
                f"{shape_name}: FlashQLA/FLA fwd+bwd speedup raw {s['raw_speedup_fwd_bwd']:.2f}x, adapter "
                f"{s['adapter_speedup_fwd_bwd']:.2f}x; adapter keeps {s['adapter_share_of_raw_pct_fwd_bwd']:.1f}% "
                f"of the raw speedup (median of per-round shares, quartiles {q1:.1f}-{q3:.1f}%; "
                f"target >= {ADAPTER_RATIO_TARGET_PCT:.0f}%)"
            )
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, from {', '.join(SHAPES)}")
    parser.add_argument("--backends", default="fla,flashqla", help="comma-separated, from fla, flashqla")
    parser.add_argument("--parity-only", action="store_true", help="skip timing (also warms kernel caches)")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds; medians over rounds are kept")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("benchmarks/gdn_kernels.py needs a CUDA GPU; run it on a Hopper or Blackwell GPU node.", file=sys.stderr)
        return 2
    unknown = set(args.shapes.split(",")) - set(SHAPES)
    if unknown:
        parser.error(f"unknown shapes {sorted(unknown)}; choose from {', '.join(SHAPES)}")

    report = {
        "device": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "versions": package_versions(),
        "date": datetime.date.today().isoformat(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "env": {name: os.environ.get(name) for name in ("FLA_FLASH_QLA", "TILELANG_CACHE_DIR", "TRITON_CACHE_DIR")},
        "unavailable": {},
        "shapes": {},
    }
    kernels = {}
    for name in args.backends.split(","):
        try:
            kernels[name] = resolve_backend(name, training=True)
        except GdnBackendUnavailable as unavailable:
            report["unavailable"][name] = str(unavailable)
            log(f"{name} unavailable: {unavailable}")
    log(f"{report['device']} {report['versions']}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    for shape_name in args.shapes.split(","):
        log(f"{shape_name}: start")
        try:
            report["shapes"][shape_name] = run_shape(SHAPES[shape_name], kernels, args.parity_only, args.rounds)
        except Exception as error:  # one shape failing must not lose the others
            traceback.print_exc()
            report["shapes"][shape_name] = {"error": f"{type(error).__name__}: {error}".splitlines()[0]}
        finally:
            torch.cuda.empty_cache()
        args.out.write_text(json.dumps(report, indent=2))
        log(f"{shape_name}: done, written to {args.out}")

    print_table(report)
    failed = [
        name
        for name, result in report["shapes"].items()
        if "error" in result or any(max(e.values()) > PARITY_TOLERANCE for e in result["parity"].values())
    ]
    return 1 if failed or report["unavailable"] else 0


if __name__ == "__main__":
    sys.exit(main())
