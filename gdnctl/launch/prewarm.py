"""`gdnctl prewarm`: compile the GDN kernels a preset's ranks will call, into the shared kernel cache.

FlashQLA's TileLang kernels compile on first use (minutes per head configuration on an H100), FLA's Triton kernels
too (98.5 s at the 35B-A3B proxy's shape, benchmarks/results/kernel-compile-prewarm-h100-2026-11-24.md);
without a warm cache every rank of every job pays that at start-up. Prewarm runs forward and backward once per
per-rank shape with the backend the preset trains with (kernels.gdn_backend, or --backend), its compiler cache
pointing where the rendered scripts point it (plan.kernel_cache_env: TileLang in the kernel cache directory, Triton
in its triton/ folder), then checks in a fresh process that a first call is now about as fast as a warm one. For
FlashQLA it says up front what the compile will cost, prints a line per kernel while TileLang compiles, and sends
the compiler's own output to gdnctl-compile.log in the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from gdnctl.errors import GdnctlError
from gdnctl.knowledge import GDN_BACKENDS, RankShape
from gdnctl.plan import kernel_cache_env
from gdnctl.runtime.kernels import ShapeTiming, compile_quietly, time_shapes


def _cache_env(cache_dir: Path) -> dict[str, str]:
    return {name: value for name, value, _ in kernel_cache_env(str(cache_dir))}


def _verify_in_fresh_process(shapes: list[RankShape], cache_dir: Path, backend: str) -> list[ShapeTiming]:
    payload = json.dumps([asdict(s) for s in shapes])
    code = (
        "import json, sys\nfrom gdnctl.knowledge import RankShape\n"
        "from gdnctl.runtime.kernels import resolve_backend, time_shapes\n"
        "shapes = [RankShape(**{**s, 'seq_lens': tuple(s['seq_lens'])}) for s in json.loads(sys.argv[1])]\n"
        "kernel = resolve_backend(sys.argv[2], training=True)\n"
        "print(json.dumps([t.__dict__ for t in time_shapes(shapes, kernel=kernel)]))"
    )
    env = {**os.environ, **_cache_env(cache_dir)}
    proc = subprocess.run(
        [sys.executable, "-c", code, payload, backend], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise GdnctlError(f"the verification run failed: {proc.stderr.strip().splitlines()[-1:]}")
    return [ShapeTiming(**t) for t in json.loads(proc.stdout.strip().splitlines()[-1])]


def prewarm(
    run, cache_dir: Path, progress: Callable[[str], None] | None = None, verify: bool = True, backend: str | None = None
) -> dict:
    """Compile `backend` (default: the preset's kernels.gdn_backend) at every per-rank shape into `cache_dir`."""
    if run.gpu.sm is None:
        raise GdnctlError("this preset runs on CPU: there are no GPU kernels to prewarm.")
    backend = backend or run.preset.kernels.gdn_backend
    cache_dir = cache_dir.expanduser().resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    env = _cache_env(cache_dir)
    # TileLang reads its cache location when it is imported; Triton and inductor read theirs at each compile.
    if "tilelang" in sys.modules and os.environ.get("TILELANG_CACHE_DIR") != env["TILELANG_CACHE_DIR"]:
        raise GdnctlError("tilelang was imported before TILELANG_CACHE_DIR was set; run prewarm in a fresh process.")
    os.environ.update(env)
    shapes = run.gdn_rank_shapes()
    from gdnctl.runtime.kernels import GdnBackendUnavailable, resolve_backend

    try:
        kernel = resolve_backend(backend, training=True)
    except GdnBackendUnavailable as err:
        raise GdnctlError(f"cannot prewarm {backend} here: {err}") from None
    # Resolved first, so that a machine that cannot run the kernel gets the reason and no compile estimate.
    chosen = GDN_BACKENDS[backend]
    compiler_cache = env[chosen.cache_variable]
    if chosen.shows_compile_progress:
        with compile_quietly(shapes, progress, header=f"gdnctl prewarm {run.preset.name}") as say:
            compiled = time_shapes(shapes, say, kernel=kernel)
    else:
        if progress:
            progress(
                f"{chosen.label}'s {chosen.compiler} kernels for {len(shapes)} kernel "
                f"shape{'s' if len(shapes) != 1 else ''} into {compiler_cache}: {chosen.cold_compile}"
            )
        compiled = time_shapes(shapes, progress, kernel=kernel)
    report = {
        "backend": backend,
        "cache_dir": str(cache_dir),
        "compiler_cache": compiler_cache,
        "compile": [asdict(t) for t in compiled],
    }
    if verify:
        if progress:
            progress("checking in a fresh process that the first call no longer compiles ...")
        fresh = _verify_in_fresh_process(shapes, cache_dir, backend)
        report["fresh_process"] = [asdict(t) for t in fresh]
        report["first_over_warm"] = {t.shape: round(t.first_call_s / t.warm_call_s, 3) for t in fresh}
    return report
