"""`gdnctl prewarm`: compile the FlashQLA (TileLang) kernels a preset's ranks will call, into a shared cache.

TileLang compiles each kernel on first use (minutes for one head configuration on an H100); without a warm
cache every rank of every job pays that at start-up. Prewarm runs forward and backward once per per-rank
shape with TILELANG_CACHE_DIR pointing at the cache the rendered scripts use, then checks in a fresh process
that a first call is now about as fast as a warm one. It says up front what the compile will cost, prints a line
per kernel while TileLang compiles, and sends the compiler's own output to gdnctl-compile.log in the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from gdnctl.errors import GdnctlError
from gdnctl.knowledge import RankShape
from gdnctl.runtime.kernels import ShapeTiming, compile_quietly, time_shapes

CACHE_ENV = "TILELANG_CACHE_DIR"


def _verify_in_fresh_process(shapes: list[RankShape], cache_dir: Path) -> list[ShapeTiming]:
    payload = json.dumps([asdict(s) for s in shapes])
    code = ("import json, sys\nfrom gdnctl.knowledge import RankShape\nfrom gdnctl.runtime.kernels import time_shapes\n"
            "shapes = [RankShape(**{**s, 'seq_lens': tuple(s['seq_lens'])}) for s in json.loads(sys.argv[1])]\n"
            "print(json.dumps([t.__dict__ for t in time_shapes(shapes)]))")
    env = {**os.environ, CACHE_ENV: str(cache_dir)}
    proc = subprocess.run([sys.executable, "-c", code, payload], capture_output=True, text=True, env=env,
                          check=False)
    if proc.returncode != 0:
        raise GdnctlError(f"the verification run failed: {proc.stderr.strip().splitlines()[-1:]}")
    return [ShapeTiming(**t) for t in json.loads(proc.stdout.strip().splitlines()[-1])]


def prewarm(run, cache_dir: Path, progress: Callable[[str], None] | None = None,
            verify: bool = True) -> dict:
    if run.gpu.sm is None:
        raise GdnctlError("this preset runs on CPU: there are no GPU kernels to prewarm.")
    cache_dir = cache_dir.expanduser().resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    # TileLang reads its cache location when it is imported: set it before anything imports tilelang.
    if "tilelang" in sys.modules and os.environ.get(CACHE_ENV) != str(cache_dir):
        raise GdnctlError(f"tilelang was imported before {CACHE_ENV} was set; run prewarm in a fresh process.")
    os.environ[CACHE_ENV] = str(cache_dir)
    shapes = run.gdn_rank_shapes()
    from gdnctl.runtime.kernels import GdnBackendUnavailable, resolve_backend

    try:
        kernel = resolve_backend("flashqla", training=True)
    except GdnBackendUnavailable as err:
        raise GdnctlError(f"cannot prewarm FlashQLA here: {err}") from None
    # Resolved first, so that a machine that cannot run FlashQLA gets the reason and no compile estimate.
    with compile_quietly(shapes, progress, header=f"gdnctl prewarm {run.preset.name}") as say:
        compiled = time_shapes(shapes, say, kernel=kernel)
    report = {"cache_dir": str(cache_dir), "compile": [asdict(t) for t in compiled]}
    if verify:
        if progress:
            progress("checking in a fresh process that the first call no longer compiles ...")
        fresh = _verify_in_fresh_process(shapes, cache_dir)
        report["fresh_process"] = [asdict(t) for t in fresh]
        report["first_over_warm"] = {t.shape: round(t.first_call_s / t.warm_call_s, 3) for t in fresh}
    return report
