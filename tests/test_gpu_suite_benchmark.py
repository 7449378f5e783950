"""benchmarks/gpu_suite.py, run for real over a small suite of its own on CPU: pytest-xdist workers, each test's
worker and time, the outcomes, and the cold-cache guard."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_suite.py"
SUITE = """
import time
import pytest

pytestmark = pytest.mark.gpu


def test_slow():
    time.sleep(0.5)


@pytest.mark.parametrize("x", [1, 2])
def test_each(x):
    assert x


@pytest.mark.xdist_group("shared")
def test_grouped():
    pass


def test_skipped():
    pytest.skip("not here")


def test_failing():
    assert False


@pytest.fixture
def broken():
    raise RuntimeError("setup fails")


def test_erroring(broken):
    pass
"""


def run_suite(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--log-dir", str(tmp_path / "logs"), *args],
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )


def test_the_result_names_each_workers_time_and_the_outcomes(tmp_path):
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_small.py").write_text(SUITE)
    out = tmp_path / "result.json"
    done = run_suite(
        tmp_path,
        "--tests",
        str(tmp_path / "suite"),
        "--workers",
        "2",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--cold",
        "--out",
        str(out),
    )
    assert done.returncode == 1, done.stdout + done.stderr  # pytest's own exit code: one test failed
    result = json.loads(out.read_text())
    assert (result["passed"], result["failed"], result["error"], result["skipped"]) == (4, 1, 1, 1)
    tests = [entry["test"] for entry in result["slowest"]]
    assert any(name.endswith("test_small.py::test_grouped") for name in tests), tests  # no "@shared" group suffix
    assert set(result["worker_busy_s"]) <= {"gw0", "gw1"}
    assert max(result["worker_busy_s"].values()) >= 0.5
    slowest = result["slowest"][0]
    assert slowest["test"].endswith("test_small.py::test_slow") and slowest["seconds"] >= 0.5
    assert slowest["worker"] in ("gw0", "gw1")
    assert "test_skipped" not in json.dumps(result["slowest"])  # a skip took no time worth listing
    assert result["cache"] == {
        "dir": str((tmp_path / "cache").resolve()),
        "cold": True,
        "bytes_before": 0,
        "bytes_after": 0,
    }
    assert (tmp_path / "logs" / "pytest.log").read_text().count("PASSED") >= 4


def test_cold_refuses_a_cache_that_holds_files(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "kernel.so").write_bytes(b"\0")
    done = run_suite(tmp_path, "--cache-dir", str(cache), "--cold")
    assert done.returncode == 2
    assert f"--cold needs an empty --cache-dir, and {cache} holds files" in done.stderr
    assert not (tmp_path / "logs").exists()  # refused before anything ran
    done = run_suite(tmp_path, "--cache-dir", str(cache / "kernel.so"))
    assert done.returncode == 2 and "is a file; name a directory" in done.stderr
