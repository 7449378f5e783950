"""What gdnctl says while kernels compile, and where the compiler's own output goes, on CPU.

The capture is run in a child process whose stdout and stderr are real pipes, so that "the console" is what a
user's terminal would get: C-level writes to fds 1 and 2 (os.write, libc printf, a child process inheriting the
descriptors), Python prints and warnings must land in the log, gdnctl's progress on the console.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdnctl.runtime.kernels.compile_log import (
    COMPILE_LOG_NAME,
    TILELANG_DEFAULT_CACHE,
    cached_kernel_files,
    capture_compiler_output,
    kernel_cache_dir,
)
from gdnctl.runtime.kernels.compile_progress import (
    TILELANG_KERNEL_LOGGER,
    ShapeCompile,
    compile_estimate,
    expected_kernels,
    kernel_label,
    kernel_progress_line,
    shape_ready_line,
    watch_compiles,
)

COMPILER_LINES = (
    "fd1 compiler line",
    "fd2 compiler warning",
    "libc printf line",
    "child stdout line",
    "child stderr line",
    "python print line",
    "python warning line",
)

CAPTURE_SCRIPT = """
import ctypes, os, subprocess, sys, warnings
from pathlib import Path
from gdnctl.runtime.kernels import capture_compiler_output

print("before the capture", flush=True)
with capture_compiler_output(Path(sys.argv[1]), "test run") as console:
    out = console.reporter(print)
    err = console.reporter(lambda text: print(text, file=sys.stderr))
    out("progress one")
    os.write(1, b"fd1 compiler line\\n")
    os.write(2, b"fd2 compiler warning\\n")
    libc = ctypes.CDLL(None)
    libc.printf(b"libc printf line\\n")
    libc.fflush(None)
    subprocess.run(["sh", "-c", "echo child stdout line; echo child stderr line >&2"], check=True)
    print("python print line")
    warnings.warn("python warning line")
    err("progress on stderr")
    out("progress two")
print("after the capture", flush=True)
"""

QUIET_SCRIPT = """
import os
from gdnctl.runtime.kernels import compile_quietly

with compile_quietly(["a", "b"], print, header="test", prewarm="gdnctl prewarm my.yaml") as say:
    os.write(2, b"fd2 compiler warning\\n")
    say("progress inside")
"""


def run_script(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_c_level_and_python_output_lands_in_the_log_and_progress_on_the_console(tmp_path):
    proc = run_script(CAPTURE_SCRIPT, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["before the capture", "progress one", "progress two", "after the capture"]
    assert proc.stderr.splitlines() == ["progress on stderr"]
    log = (tmp_path / COMPILE_LOG_NAME).read_text()
    assert "test run (pid " in log.splitlines()[1]
    for line in COMPILER_LINES:
        assert line in log, line
    assert "progress" not in log


def test_each_run_appends_under_its_own_header(tmp_path):
    for _ in range(2):
        assert run_script(CAPTURE_SCRIPT, str(tmp_path)).returncode == 0
    log = (tmp_path / COMPILE_LOG_NAME).read_text()
    assert log.count("test run (pid ") == 2 and log.count("fd1 compiler line") == 2


def test_a_cache_dir_that_cannot_hold_the_log_leaves_the_output_on_the_console(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with capture_compiler_output(blocker / "cache", "test") as console:
        assert console.log_path is None
        assert console.note.startswith(f"compiler output stays on this console: cannot write {blocker}")


def test_no_progress_callback_stays_none(tmp_path):
    with capture_compiler_output(tmp_path, "test") as console:
        assert console.reporter(None) is None


def test_compile_quietly_says_the_estimate_and_the_log_before_capturing(tmp_path):
    proc = run_script(QUIET_SCRIPT, env={"TILELANG_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        compile_estimate(2, tmp_path, 0, "gdnctl prewarm my.yaml"),
        f"compiler output goes to {tmp_path / COMPILE_LOG_NAME}",
        "progress inside",
    ]
    assert proc.stderr == ""
    assert "fd2 compiler warning" in (tmp_path / COMPILE_LOG_NAME).read_text()


# --- the kernel cache -------------------------------------------------------------------------------------------


def test_the_compile_log_alone_leaves_a_cache_cold(tmp_path):
    assert cached_kernel_files(tmp_path / "missing") == 0
    (tmp_path / COMPILE_LOG_NAME).write_text("log")
    assert cached_kernel_files(tmp_path) == 0
    (tmp_path / "0.1.15" / "linux-x86_64" / "kernels" / "abc").mkdir(parents=True)
    (tmp_path / "0.1.15" / "linux-x86_64" / "kernels" / "abc" / "kernel_lib.so").write_bytes(b"")
    assert cached_kernel_files(tmp_path) == 1


def test_kernel_cache_dir_follows_tilelang_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    assert kernel_cache_dir() == tmp_path
    monkeypatch.delenv("TILELANG_CACHE_DIR")
    assert kernel_cache_dir() == Path(TILELANG_DEFAULT_CACHE).expanduser()


# --- the estimate -----------------------------------------------------------------------------------------------


def test_estimate_for_a_cold_cache():
    assert compile_estimate(3, Path("/shared/tl"), 0, "gdnctl prewarm my.yaml") == (
        "FlashQLA kernels for 3 kernel shapes to compile into the empty kernel cache /shared/tl: about 2.5-6 min "
        "per shape on an H100, 7.5-18 min in all; `gdnctl prewarm my.yaml` does this once, ahead of the job."
    )


def test_estimate_for_one_shape_needs_no_total():
    assert compile_estimate(1, Path("/c"), 0, None) == (
        "FlashQLA kernels for 1 kernel shape to compile into the empty kernel cache /c: about 2.5-6 min per shape "
        "on an H100."
    )


def test_estimate_for_a_warm_cache():
    assert compile_estimate(1, Path("/shared/tl"), 42, None) == (
        "FlashQLA kernels for 1 kernel shape: the kernel cache /shared/tl holds 42 files, so a shape compiled into "
        "it before loads in seconds; one it lacks compiles in about 2.5-6 min on an H100."
    )


# --- the progress lines -----------------------------------------------------------------------------------------


def test_progress_line_names_the_shape_the_kernel_and_the_time():
    assert kernel_label("tilelang_fused_chunk_gdr_bwd_kernel") == "fused_chunk_gdr_bwd"
    assert kernel_progress_line("tp1-1x1024", 3, 7, "fused_chunk_gdr_bwd", 41.4) == (
        "compiling FlashQLA kernels for tp1-1x1024: 3/7 fused_chunk_gdr_bwd, 41 s"
    )


def test_more_kernels_than_expected_raise_the_count_shown():
    line = kernel_progress_line("s", 8, 6, "correct_h0", 100)
    assert line == "compiling FlashQLA kernels for s: 8/8+ correct_h0, 100 s"


def test_expected_kernels_add_the_group_reduction_for_grouped_value_heads():
    assert expected_kernels(8, 8) == 6 and expected_kernels(16, 32) == 7


def test_ready_line_says_how_many_were_compiled_when_any_were_seen():
    assert shape_ready_line("s", 6, 152.3) == "FlashQLA kernels for s ready in 152 s (6 compiled)"
    assert shape_ready_line("s", 0, 0.42) == "FlashQLA kernels for s ready in 0.4 s"


def test_shape_compile_reports_each_kernel_as_it_begins():
    lines: list[str] = []
    progress = ShapeCompile("tp1-1x1024", 6, lines.append)
    for symbol in ("tilelang_chunk_local_cumsum_kernel", "tilelang_kkt_solve_kernel"):
        progress.kernel_begins(symbol)
    assert [line.rsplit(",", 1)[0] for line in lines] == [
        "compiling FlashQLA kernels for tp1-1x1024: 1/6 chunk_local_cumsum",
        "compiling FlashQLA kernels for tp1-1x1024: 2/6 kkt_solve",
    ]
    assert progress.ready_line().endswith("(2 compiled)")


def test_watch_compiles_says_when_the_shape_is_ready_and_leaves_the_logger_as_it_was():
    logger = logging.getLogger(TILELANG_KERNEL_LOGGER)
    handlers, level = list(logger.handlers), logger.level
    lines: list[str] = []
    with watch_compiles("tp1-1x1024", 6, lines.append):
        assert logger.getEffectiveLevel() <= logging.INFO
    assert lines == ["FlashQLA kernels for tp1-1x1024 ready in 0.0 s"]
    assert logger.handlers == handlers and logger.level == level


def test_watch_compiles_says_nothing_more_when_the_compile_fails():
    logger = logging.getLogger(TILELANG_KERNEL_LOGGER)
    handlers = list(logger.handlers)
    lines: list[str] = []
    with pytest.raises(RuntimeError), watch_compiles("s", 6, lines.append):
        raise RuntimeError("nvcc failed")
    assert lines == [] and logger.handlers == handlers


def test_a_mid_run_compile_gets_a_line_and_tilelangs_records_go_to_the_cache_log(tmp_path, monkeypatch):
    """compiles_logged, with the record TileLang 0.1.15 logs per compile (seen on an H100 run, 2026-11-24)."""
    import logging

    from gdnctl.runtime.kernels import COMPILE_LOG_NAME, compiles_logged

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    tilelang_logger = logging.getLogger("tilelang")
    console = logging.StreamHandler()
    tilelang_logger.addHandler(console)  # what TileLang installs on import
    said = []
    try:
        with compiles_logged("training", said.append):
            logging.getLogger("tilelang.jit.kernel").info(
                "TileLang begins to compile kernel `tilelang_fused_chunk_gdr_fwd_kernel` with `out_idx=None`"
            )
            # FLA's TileLang backend (FLA 0.6.0 on an H100, 2026-11-26): its kernels' label is `kernel`.
            for symbol in ("kernel", "tilelang_kernel"):
                logging.getLogger("tilelang.jit.kernel").info(
                    f"TileLang begins to compile kernel `{symbol}` with `out_idx=None`"
                )
            assert tilelang_logger.handlers != [console]
        assert tilelang_logger.handlers == [console]  # restored
    finally:
        tilelang_logger.removeHandler(console)
    assert said == [
        f"compiling FlashQLA kernel fused_chunk_gdr_fwd during training (compiler output: "
        f"{tmp_path / COMPILE_LOG_NAME})",
        *[f"compiling a TileLang kernel during training (compiler output: {tmp_path / COMPILE_LOG_NAME})"] * 2,
    ]
    assert "TileLang begins to compile kernel" in (tmp_path / COMPILE_LOG_NAME).read_text()
