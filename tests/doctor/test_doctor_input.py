"""What the doctor is handed that is not what it expects: a --facts file of any other shape, type or kind of file
(a sentence, exit 2, never a crash), and an interpreter another user could have put in the preset's path (not run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FACTS = Path(__file__).parent / "facts"
CPU = json.loads((FACTS / "cpu-only.json").read_text())


def doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gdnctl", "doctor", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ([CPU], "the top level"),
        ("3.11", "the top level"),
        ({**CPU, "env": {"NCCL_DEBUG": 1}}, "env.NCCL_DEBUG"),
        ({**CPU, "env": ["NCCL_DEBUG"]}, "env"),
        ({**CPU, "python_version": 3.11}, "python_version"),
        ({**CPU, "gpus": [{"name": "H100", "sm": "9.0", "memory_gib": 80}]}, "gpus.0.sm"),
        ({**CPU, "gpus": [{"name": "H100", "sm": [9, 0]}]}, "gpus.0.memory_gib"),
        ({**CPU, "packages": {"torch": 2}}, "packages.torch"),
        (
            {**CPU, "kernel_cache": {"path": "/x", "exists": "no", "writable": True, "entries": 0}},
            "kernel_cache.exists",
        ),
        ({**CPU, "rollout_env": {"python": "/x"}}, "rollout_env.vllm"),
        ({key: value for key, value in CPU.items() if key != "python_version"}, "python_version"),
    ],
)
def test_a_facts_file_of_the_wrong_shape_or_type_is_named(tmp_path, document, named):
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(document))
    proc = doctor("--facts", str(facts))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{facts} is not a facts file written by --save-facts ({named}:" in proc.stderr
    assert "--save-facts FILE" in proc.stderr


def _special_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"python_version": "3.11\xe9"}')
    big = tmp_path / "big.json"
    with big.open("wb") as stream:
        stream.truncate(17 * 1024**2)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    return {
        "fifo": (fifo, "named pipe (FIFO), not a regular file"),
        "zero": (zero, "a device, not a regular file"),
        "utf8": (bad, "is not UTF-8 text"),
        "big": (big, "larger than 16 MiB"),
        "directory": (tmp_path, "a directory, not a regular file"),
        "missing": (tmp_path / "no.json", "does not exist"),
        "deep": (deep, "is not a facts file"),
    }


@pytest.mark.parametrize("kind", ["fifo", "zero", "utf8", "big", "directory", "missing", "deep"])
def test_a_facts_file_that_cannot_be_read_is_named_without_hanging(tmp_path, kind):
    path, reason = _special_files(tmp_path)[kind]
    proc = doctor("--facts", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert str(path) in proc.stderr and reason in proc.stderr


def test_the_doctor_does_not_run_an_interpreter_another_user_could_have_planted(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    canary = tmp_path / "ran"
    python = shared / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\ntouch {canary}\necho 0.32.0\n")
    python.chmod(0o755)
    proc = doctor("tiny-qwen3.5-rl-cpu", "--set", f"rollout.python={python}", "--json")
    checks = {check["name"]: check for check in json.loads(proc.stdout)["checks"]}
    assert not canary.exists()
    assert checks["vllm"]["status"] == "FAIL" and "not run: another user could replace it" in checks["vllm"]["found"]
    assert (
        checks["preset.python"]["status"] == "WARN"
        and f"{shared} is writable by every user" in checks["preset.python"]["found"]
    )


def test_an_interpreter_only_you_can_replace_is_ok():
    proc = doctor("selftest-cpu", "--json")
    checks = {check["name"]: check for check in json.loads(proc.stdout)["checks"]}
    # selftest-cpu leaves launch.python unset: the job runs gdnctl's own interpreter, and doctor judges that one.
    found = checks["preset.python"]["found"]
    assert checks["preset.python"]["status"] == "OK"
    assert f"launch.python {sys.executable}" in found or f"launch.python {os.path.realpath(sys.executable)}" in found
