"""`gdnctl doctor --kernels / --bench`: the GDN kernels at the preset's per-rank shapes on this GPU.

Parity runs each backend of gdnctl/knowledge/gdn_backends.py through the runtime's adapter against the fp32
reference, forward and backward, and reports the largest relative error per tensor; timing uses triton's do_bench
(median), each backend against the default one. Both run inside `kernels_compiled`, which has the backends that
show compile progress (FlashQLA's TileLang) compile (or load) their kernels at every shape first, saying what that
costs and which kernel it is on, with the compiler's own output in the kernel cache's log.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gdnctl.doctor.checks import Check, Status
from gdnctl.doctor.facts import MachineFacts
from gdnctl.errors import GdnctlError
from gdnctl.knowledge import DEFAULT_GDN_BACKEND, GDN_BACKENDS, RankShape

TOLERANCE = 1e-2  # relative error ||a - b|| / ||b|| against the fp32 reference, per tensor
# The bench's yardstick: each other backend's speedup is this one's time over its own.
BASELINE = DEFAULT_GDN_BACKEND
CHALLENGERS = tuple(name for name in GDN_BACKENDS if name != BASELINE)


@dataclass(frozen=True)
class BenchMode:
    key: str  # a backend's time in a bench row, in ms
    speedup: str  # a challenger's speedup over the baseline, beside its times
    heading: str  # the table's column, after the backend's bench label
    label: str  # the chart's


MODES = (BenchMode("fwd_ms", "speedup_fwd", "fwd", "fwd"), BenchMode("fwd_bwd_ms", "speedup_fwd_bwd", "f+b", "fwd+bwd"))


def _say(progress: Callable[[str], None] | None, text: str) -> None:
    if progress is not None:
        progress(text)


def _gdn_shape(shape: RankShape):
    from gdnctl.runtime.kernels import GdnShape

    return GdnShape(shape.name, shape.qk_heads, shape.v_heads, shape.seq_lens, shape.packed, shape.head_dim)


def _available(backend: str, run):
    """(kernel, None) or (None, reason)."""
    from gdnctl.runtime.kernels import GdnBackendUnavailable, resolve_backend

    try:
        return resolve_backend(backend, training=run.is_training), None
    except GdnBackendUnavailable as err:
        return None, str(err)


@contextlib.contextmanager
def kernels_compiled(
    run, facts: MachineFacts, preset_args: str, progress: Callable[[str], None] | None
) -> Iterator[Callable[[str], None] | None]:
    """Compile (or load) the kernels of the backends that show compile progress at the preset's shapes, then run
    the block with the compiler's output still going to the kernel cache's log; yields the progress callback for
    the block. A backend that cannot run here compiles nothing, and the checks say why. `preset_args`: the preset
    and its --set overrides, as typed."""
    watched = [backend.name for backend in GDN_BACKENDS.values() if backend.shows_compile_progress]
    kernels = (
        [kernel for kernel, _ in (_available(name, run) for name in watched) if kernel is not None]
        if facts.gpus
        else []
    )
    if not kernels:
        yield progress
        return
    from gdnctl.runtime.kernels import compile_quietly, time_shapes

    shapes = run.gdn_rank_shapes()
    with compile_quietly(
        shapes, progress, header=f"gdnctl doctor {preset_args}", prewarm=f"gdnctl prewarm {preset_args}"
    ) as say:
        for kernel in kernels:
            time_shapes(shapes, say, kernel=kernel)
        yield say


def parity_checks(run, facts: MachineFacts, progress=None) -> list[Check]:
    if not facts.gpus:
        return [Check("kernels", Status.SKIP, "no CUDA GPU: kernel parity needs one")]
    from gdnctl.runtime.kernels import make_gdn_inputs, parity_errors

    results = []
    for backend in GDN_BACKENDS:
        kernel, reason = _available(backend, run)
        if kernel is None:
            chosen = backend == run.preset.kernels.gdn_backend
            results.append(Check(f"kernels.{backend}", Status.FAIL if chosen else Status.SKIP, reason or ""))
            continue
        for shape in run.gdn_rank_shapes():
            _say(progress, f"doctor: {backend} vs fp32 reference at {shape.name}")
            inputs = make_gdn_inputs(_gdn_shape(shape), device="cuda")
            errors = parity_errors(kernel, inputs)
            worst = worst_error(errors)
            text = ", ".join(f"{name} {value:.1e}" for name, value in errors.items())
            ok = errors[worst] <= TOLERANCE  # False for NaN too
            results.append(
                Check(
                    f"kernels.{backend}.{shape.name}",
                    Status.OK if ok else Status.FAIL,
                    text,
                    ""
                    if ok
                    else f"{worst} is {errors[worst]:.2e} > {TOLERANCE}: check the kernel "
                    "versions (flash-qla >= 0.1.3, fla 0.6)",
                )
            )
    return results


def worst_error(errors: dict[str, float]) -> str:
    """The tensor furthest from the reference; a NaN (Blackwell's NaN gradients, fla #913) is the worst of all,
    though it compares False with every number, so a plain max would pass it by."""
    return max(errors, key=lambda name: math.inf if math.isnan(errors[name]) else errors[name])


def _time_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def bench(run, facts: MachineFacts, progress=None) -> list[dict]:
    if not facts.gpus:
        raise GdnctlError("--bench needs a CUDA GPU; this machine has none.")
    from gdnctl.runtime.kernels import make_gdn_inputs

    rows = []
    for shape in run.gdn_rank_shapes():
        row: dict = {"shape": shape.name, "qk_heads": shape.qk_heads, "v_heads": shape.v_heads, "tokens": shape.tokens}
        for backend in GDN_BACKENDS:
            kernel, reason = _available(backend, run)
            if kernel is None:
                row[backend] = {"error": reason}
                continue
            _say(progress, f"doctor: timing {backend} at {shape.name}")
            inputs = make_gdn_inputs(_gdn_shape(shape), device="cuda")
            leaves = {
                k: (v.detach().requires_grad_(True) if k in ("q", "k", "v", "g", "beta") else v)
                for k, v in inputs.items()
            }

            def forward(kernel=kernel, leaves=leaves):  # this backend's kernel and inputs, bound now
                return kernel(
                    leaves["q"],
                    leaves["k"],
                    leaves["v"],
                    g=leaves["g"],
                    beta=leaves["beta"],
                    cu_seqlens=leaves["cu_seqlens"],
                )[0]

            def forward_backward():
                forward().sum().backward()

            row[backend] = {"fwd_ms": round(_time_ms(forward), 4), "fwd_bwd_ms": round(_time_ms(forward_backward), 4)}
        for challenger in CHALLENGERS:
            if all("fwd_ms" in row[name] for name in (BASELINE, challenger)):
                row[challenger].update(
                    {mode.speedup: round(row[BASELINE][mode.key] / row[challenger][mode.key], 3) for mode in MODES}
                )
        rows.append(row)
    return rows


def format_bench(rows: list[dict]) -> str:
    """Per mode, each backend's time, then each challenger's speedup over the baseline ("x")."""
    widths = [9] * len(GDN_BACKENDS) + [6] * len(CHALLENGERS)

    def line(first: str, cells: list[str]) -> str:
        return " ".join(
            [f"{first:<24}", *(f"{cell:>{width}}" for cell, width in zip(cells, widths * len(MODES), strict=False))]
        )

    headings = [
        heading
        for mode in MODES
        for heading in [f"{backend.bench_label} {mode.heading}" for backend in GDN_BACKENDS.values()]
        + ["x"] * len(CHALLENGERS)
    ]
    lines = [line("shape", headings)]
    for row in rows:
        cells = []
        for mode in MODES:
            cells += [f"{row[name][mode.key]:.3f}" if mode.key in row[name] else "n/a" for name in GDN_BACKENDS]
            cells += [str(row[name].get(mode.speedup, "n/a")) for name in CHALLENGERS]
        lines.append(line(row["shape"], cells))
    challengers = " or ".join(GDN_BACKENDS[name].label for name in CHALLENGERS)
    lines.append(
        f"times in ms (median of triton do_bench); x = {GDN_BACKENDS[BASELINE].label} time / {challengers} time"
    )
    return "\n".join(lines)


def save_chart(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise GdnctlError("--chart needs matplotlib: pip install matplotlib.") from None
    shapes = [row["shape"] for row in rows]
    fig, ax = plt.subplots(figsize=(1.8 * len(shapes) + 3, 4))
    width = 0.2
    bars = [(backend, mode) for mode in MODES for backend in GDN_BACKENDS]
    middle = (len(bars) - 1) / 2
    for offset, (backend, mode) in enumerate(bars):
        values = [row[backend].get(mode.key, 0.0) for row in rows]
        ax.bar(
            [i + (offset - middle) * width for i in range(len(rows))], values, width, label=f"{backend} {mode.label}"
        )
    ax.set_xticks(range(len(rows)), shapes)
    ax.set_ylabel("ms (median)")
    ax.set_title("GDN kernel time per call at the preset's per-rank shapes")
    tallest = max((row[b].get("fwd_bwd_ms", 0.0) for row in rows for b in GDN_BACKENDS), default=1.0)
    ax.set_ylim(top=tallest * 1.4)  # headroom so the legend never covers a bar
    ax.legend(loc="upper left", ncols=len(GDN_BACKENDS), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
