"""What the machine does to a command is no bug of gdnctl's: a full disk, a read-only filesystem or a file-size
limit while rendering is a sentence naming the path (exit 2, never 70), a reader of stdout that goes away ends the
command quietly, and the manifest hashes the preset bytes the render used, also when they came from a pipe."""

from __future__ import annotations

import hashlib
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from gdnctl.cli import BROKEN_PIPE_EXIT, INTERNAL_ERROR_EXIT
from gdnctl.resources import presets_dir


def gdnctl(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gdnctl", *args], capture_output=True, text=True, timeout=120, **kwargs
    )


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a tmpfs of the given size (and read-only or not) at a fresh directory; skips where mount is refused."""
    mounted = []

    def mount(size: str, read_only: bool = False) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()})")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def _assert_sentence(proc: subprocess.CompletedProcess, *said: str) -> None:
    assert proc.returncode == 2 and proc.returncode != INTERNAL_ERROR_EXIT, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gdnctl: ")]
    assert len(lines) == 1, proc.stderr
    for text in said:
        assert text in lines[0], lines[0]


def test_a_full_disk_while_rendering_names_the_file(tmpfs):
    disk = tmpfs("12k")
    proc = gdnctl("render", "qwen3.5-35b-a3b-grpo", "-o", str(disk / "run"))
    _assert_sentence(proc, str(disk), "No space left on device, ENOSPC", "free space there or write elsewhere")


def test_a_read_only_filesystem_names_the_directory(tmpfs):
    disk = tmpfs("1m", read_only=True)
    proc = gdnctl("render", "selftest-cpu", "-o", str(disk / "run"), "--json")
    _assert_sentence(proc, str(disk), "Read-only file system, EROFS")
    assert json.loads(proc.stdout)["exit_code"] == 2


def test_a_file_size_limit_names_the_file(tmp_path):
    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    proc = gdnctl("render", "qwen3.5-35b-a3b-grpo", "-o", str(tmp_path / "run"), preexec_fn=limit_file_size)
    _assert_sentence(proc, str(tmp_path), "File too large, EFBIG", "ulimit -f")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["explain", "qwen3.5-35b-a3b-grpo"],
        ["rules", "--markdown"],
        ["presets", "list"],
        ["--help"],
        ["validate", "qwen3.5-35b-a3b-grpo", "--json"],
    ],
)
def test_a_closed_stdout_ends_the_command_quietly(args):
    process = subprocess.Popen([sys.executable, "-m", "gdnctl", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # `| head` that has read what it wanted
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == BROKEN_PIPE_EXIT, stderr.decode()
    assert stderr == b""


def test_the_manifest_hashes_the_preset_bytes_read_from_a_pipe(tmp_path):
    preset = (presets_dir() / "selftest-cpu.yaml").read_bytes()
    proc = gdnctl("render", "/dev/stdin", "-o", str(tmp_path / "run"), input=preset.decode())
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads((tmp_path / "run" / "manifest.json").read_text())["preset"]["files"]
    assert entry == {"path": "/dev/stdin", "sha256": hashlib.sha256(preset).hexdigest()}
