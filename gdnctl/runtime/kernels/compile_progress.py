"""What gdnctl says while TileLang compiles FlashQLA's kernels: an estimate before, one line per kernel during.

Per-kernel progress is read from TileLang's logging, the least fragile hook there is: a `logging.Handler` patches
nothing. TileLang's `JITKernel.__init__` (tilelang/jit/kernel.py, alike in the 0.1.12 and 0.1.15 wheels) logs
"TileLang begins to compile kernel `<global symbol>`" to the `tilelang.jit.kernel` logger for every kernel it
compiles, that is every one missing from its memory and disk caches (a disk-cache hit goes through
`JITKernel.from_database` and logs nothing), as long as TILELANG_PRINT_ON_COMPILATION keeps its default "1".
The handler depends on that logger's name and that sentence; a TileLang that changes either gives no per-kernel
lines, and `watch_compiles` still says when each shape is ready, so the output degrades to one line per shape
and never breaks a run.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gdnctl.runtime.kernels.compile_log import (
    COMPILE_LOG_NAME,
    cached_kernel_files,
    capture_compiler_output,
    kernel_cache_dir,
)

Progress = Callable[[str], None]

# FlashQLA's forward+backward kernels per head/length configuration on an H100, cold cache
# (benchmarks/results/kernel-compile-prewarm-h100-2026-11-24.md).
COLD_MINUTES_PER_SHAPE = (2.5, 6.0)
# TileLang kernels one forward+backward call of flash-qla 0.1.3 compiles on Hopper and SM100
# (flash_qla/ops/gated_delta_rule/chunk): chunk_local_cumsum forward and reversed (for dg), kkt_solve,
# fused_chunk_gdr_fwd, prepare_h and fused_chunk_gdr_bwd, plus group_reduce_vector when q/k have fewer heads
# than v. Its intra-card context parallelism, which it decides per call, and SM120's padding kernel for varlen
# backward add kernels; the count shown then grows to what is observed ("7/7+"). A shape whose kernels an
# earlier shape already compiled (token counts are dynamic in these kernels) shows fewer. Measured on an H100
# (2026-11-24, tiny-qwen3.5-sft, 8 heads x 1024 tokens, cold cache): 11 kernels for the fixed-length shape,
# intra-card CP's get_warmup_chunks_bidi / correct_h0 / prepare_dh among them, then 3 for the varlen shape.
PLAIN_PATH_KERNELS = 6
TILELANG_LOGGER = "tilelang"  # TileLang 0.1.15 gives this logger its own console handler
TILELANG_KERNEL_LOGGER = "tilelang.jit.kernel"
_COMPILE_BEGINS = re.compile(r"TileLang begins to compile kernel `([^`]+)`")


def expected_kernels(qk_heads: int, v_heads: int) -> int:
    return PLAIN_PATH_KERNELS + (1 if qk_heads < v_heads else 0)


def compile_estimate(shapes: int, cache_dir: Path, cached_files: int, prewarm: str | None) -> str:
    """What compiling `shapes` kernel shapes into `cache_dir` will cost, in one sentence."""
    low, high = COLD_MINUTES_PER_SHAPE
    count = f"{shapes} kernel shape{'s' if shapes != 1 else ''}"
    if cached_files:
        text = (
            f"FlashQLA kernels for {count}: the kernel cache {cache_dir} holds {cached_files} files, so a shape "
            f"compiled into it before loads in seconds; one it lacks compiles in about {low:g}-{high:g} min "
            "on an H100"
        )
    else:
        text = (
            f"FlashQLA kernels for {count} to compile into the empty kernel cache {cache_dir}: about "
            f"{low:g}-{high:g} min per shape on an H100"
        )
        if shapes > 1:
            text += f", {shapes * low:g}-{shapes * high:g} min in all"
    return text + (f"; `{prewarm}` does this once, ahead of the job." if prewarm else ".")


def kernel_label(symbol: str) -> str:
    """`tilelang_fused_chunk_gdr_bwd_kernel` -> `fused_chunk_gdr_bwd`: FlashQLA's name for the kernel."""
    return symbol.removeprefix("tilelang_").removesuffix("_kernel")


def mid_run_compile_line(symbol: str, during: str, log_path: str) -> str:
    """FlashQLA's kernels are `tilelang_<name>_kernel`; FLA's TileLang backend (which FLA 0.6 picks for some of its
    own kernels, e.g. `chunk_bwd_dqkwg`, where TileLang is installed) gave the label `kernel` on an H100 run."""
    label = kernel_label(symbol)
    named = symbol.startswith("tilelang_") and label != "kernel"
    what = f"FlashQLA kernel {label}" if named else "a TileLang kernel"
    return f"compiling {what} during {during} (compiler output: {log_path})"


def kernel_progress_line(shape: str, index: int, expected: int, kernel: str, elapsed_s: float) -> str:
    total = str(expected) if index <= expected else f"{index}+"  # past the plain path: more may follow
    return f"compiling FlashQLA kernels for {shape}: {index}/{total} {kernel}, {elapsed_s:.0f} s"


def shape_ready_line(shape: str, compiled: int, elapsed_s: float) -> str:
    # Without observed compiles the kernels came from the cache, or TileLang no longer logs the sentence this
    # module reads: the line says only what is known.
    if compiled:
        return f"FlashQLA kernels for {shape} ready in {elapsed_s:.0f} s ({compiled} compiled)"
    return f"FlashQLA kernels for {shape} ready in {elapsed_s:.1f} s"


@dataclass
class ShapeCompile:
    """The kernels compiled for one shape so far, each reported as it starts."""

    shape: str
    expected: int
    report: Progress | None
    started: float = field(default_factory=time.monotonic)
    kernels: list[str] = field(default_factory=list)

    def kernel_begins(self, symbol: str) -> None:
        self.kernels.append(kernel_label(symbol))
        _say(
            self.report,
            kernel_progress_line(
                self.shape, len(self.kernels), self.expected, self.kernels[-1], time.monotonic() - self.started
            ),
        )

    def ready_line(self) -> str:
        return shape_ready_line(self.shape, len(self.kernels), time.monotonic() - self.started)


class _CompileBeginsHandler(logging.Handler):
    def __init__(self, on_kernel: Callable[[str], None]):
        super().__init__(logging.INFO)
        self.on_kernel = on_kernel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            match = _COMPILE_BEGINS.search(record.getMessage())
            if match:
                self.on_kernel(match.group(1))
        except Exception:  # a progress line must never fail a compile: logging reports it and goes on
            self.handleError(record)


@contextlib.contextmanager
def watch_compiles(shape: str, expected: int, report: Progress | None) -> Iterator[ShapeCompile]:
    """A line per kernel TileLang compiles inside the block, then one when the shape's kernels are ready."""
    progress = ShapeCompile(shape, expected, report)
    logger = logging.getLogger(TILELANG_KERNEL_LOGGER)
    handler = _CompileBeginsHandler(progress.kernel_begins)
    level = logger.level
    logger.addHandler(handler)
    # TileLang sets INFO on its "tilelang" logger when imported; before that the effective level is Python's
    # WARNING and the record would never be made.
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield progress
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    _say(report, progress.ready_line())


@contextlib.contextmanager
def compile_quietly(
    shapes: Sequence[object], report: Progress | None, *, header: str, prewarm: str | None = None
) -> Iterator[Progress | None]:
    """Say what compiling `shapes` will cost, then send the compiler's output to the kernel cache's log for the
    duration; yields `report` made to reach the terminal (None stays None: nothing is said)."""
    cache_dir = kernel_cache_dir()
    if report is not None:
        report(compile_estimate(len(shapes), cache_dir, cached_kernel_files(cache_dir), prewarm))
    with capture_compiler_output(cache_dir, header) as console:
        terminal = console.reporter(report)
        _say(terminal, console.note)
        yield terminal


def _say(report: Progress | None, text: str) -> None:
    if report is not None:
        report(text)


@contextlib.contextmanager
def compiles_logged(during: str, report: Progress | None) -> Iterator[None]:
    """For a whole job after its warm-up: TileLang's own log records go to the kernel cache's log instead of the
    console, and a kernel compiled mid-job (a packed micro-batch of a shape the warm-up did not cover) gets one
    line through `report`. Python-level records only (TileLang logs its compiles through `logging`), so the job's
    own output is never redirected."""
    logger = logging.getLogger(TILELANG_LOGGER)
    try:
        sink = logging.FileHandler(kernel_cache_dir() / COMPILE_LOG_NAME)
    except OSError:  # no writable cache dir: TileLang's lines stay on the console, as without gdnctl
        yield
        return
    sink.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    saved_handlers, saved_propagate = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [sink], False
    begins = _CompileBeginsHandler(lambda symbol: _say(report, mid_run_compile_line(symbol, during, sink.baseFilename)))
    kernel_logger = logging.getLogger(TILELANG_KERNEL_LOGGER)
    kernel_logger.addHandler(begins)
    level = kernel_logger.level
    if kernel_logger.getEffectiveLevel() > logging.INFO:  # as in watch_compiles: TileLang not imported yet
        kernel_logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        kernel_logger.removeHandler(begins)
        kernel_logger.setLevel(level)
        logger.handlers, logger.propagate = saved_handlers, saved_propagate
        sink.close()
