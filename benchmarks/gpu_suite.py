"""The GPU test suite's wall time, warm or cold, and where it goes (the target: the whole `pytest -m gpu` in
<= 10 minutes on one H100 with the compile caches carried in, <= 20 minutes from empty caches).

    python benchmarks/gpu_suite.py [--workers 8] [--cache-dir DIR] [--cold] [--vllm-python PATH]
                                   [--log-dir DIR] [--out results.json] [--tests tests]

Runs `pytest -m gpu -n WORKERS --dist loadgroup` over --tests with every compiler cache the launches and the
in-process kernel tests fill (TileLang, Triton with its autotuning results, inductor) under --cache-dir, the
layout `gdnctl launch` renders for launch.kernel_cache_dir. --cold asks for an empty (or missing) --cache-dir and
refuses anything else, so a cold figure is cold. The result: wall time, outcomes, how long each xdist worker was
busy (the longest is the critical path), the slowest tests, and the cache's size before and after, printed and
written to --out as JSON. Progress is pytest's own output, kept in LOG_DIR/pytest.log as well.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = Path("~/.cache/gdnctl/tilelang").expanduser()
SLOWEST = 12
# Where this file, loaded by pytest as a plugin, writes each test phase it hears of.
REPORT_ENV = "GDNCTL_SUITE_REPORT"
TRAINER_PACKAGES = (
    "torch",
    "triton",
    "transformer-engine",
    "megatron-core",
    "megatron-bridge",
    "fla-core",
    "flash-qla",
    "tilelang",
    "transformers",
    "pytest",
    "pytest-xdist",
)


def cache_env(cache_dir: Path) -> dict[str, str]:
    """The variables `gdnctl launch` exports for a kernel cache (plan/decisions.kernel_cache_env), so that the
    launches and the tests that compile in their own process fill one directory."""
    from gdnctl.plan.decisions import kernel_cache_env

    return {name: value for name, value, _ in kernel_cache_env(str(cache_dir))}


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def versions(vllm_python: str | None) -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in TRAINER_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    if vllm_python:
        proc = subprocess.run(
            [vllm_python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
            text=True,
            capture_output=True,
            check=False,
        )
        found["vllm"] = proc.stdout.strip() if proc.returncode == 0 else None
    return found


def device_name() -> str | None:
    proc = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], text=True, capture_output=True, check=False
        )
        if shutil.which("nvidia-smi")
        else None
    )
    names = proc.stdout.strip().splitlines() if proc and proc.returncode == 0 else []
    return f"{len(names)} x {names[0]}" if names else None


def pytest_runtest_logreport(report) -> None:
    """pytest hook: this file is also the pytest plugin (-p gpu_suite) that records, on the xdist controller, each
    test phase's worker, duration and outcome, one JSON line each, to the file REPORT_ENV names."""
    node = getattr(report, "node", None)  # set on the controller only: the worker that ran the phase
    target = os.environ.get(REPORT_ENV)
    if node is None or not target:
        return
    with open(target, "a") as out:
        out.write(
            json.dumps(
                {
                    "test": _without_group(report.nodeid),
                    "worker": node.gateway.id,
                    "when": report.when,
                    "seconds": report.duration,
                    "outcome": report.outcome,
                }
            )
            + "\n"
        )


def _without_group(nodeid: str) -> str:
    """pytest-xdist's loadgroup names a grouped test "nodeid@group" (remote.py); the test's own id has no '@'
    outside its parameters' brackets."""
    test, at, group = nodeid.rpartition("@")
    return test if at and "]" not in group and "::" in test else nodeid


def test_records(report: Path) -> dict[str, dict]:
    """test -> {seconds (setup, call and teardown), outcome, worker} from the plugin's lines. A failed setup or
    teardown is an error, as pytest counts it; a failed call a failure."""
    tests: dict[str, dict] = {}
    for line in report.read_text().splitlines() if report.is_file() else []:
        phase = json.loads(line)
        test = tests.setdefault(phase["test"], {"seconds": 0.0, "outcome": "passed", "worker": phase["worker"]})
        test["seconds"] += phase["seconds"]
        if phase["outcome"] == "failed":
            test["outcome"] = "failed" if phase["when"] == "call" else "error"
        elif phase["outcome"] == "skipped" and test["outcome"] == "passed":
            test["outcome"] = "skipped"
    return tests


def summarise(wall_s: float, exit_code: int, tests: dict[str, dict]) -> dict:
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    busy: dict[str, float] = {}
    for test in tests.values():
        counts[test["outcome"]] += 1
        busy[test["worker"]] = busy.get(test["worker"], 0.0) + test["seconds"]
    ran = sorted((t for t in tests.items() if t[1]["outcome"] != "skipped"), key=lambda t: -t[1]["seconds"])
    return {
        "wall_s": round(wall_s, 1),
        "pytest_exit_code": exit_code,
        **counts,
        "worker_busy_s": {name: round(seconds, 1) for name, seconds in sorted(busy.items())},
        "slowest": [
            {"test": name, "seconds": round(test["seconds"], 1), "outcome": test["outcome"], "worker": test["worker"]}
            for name, test in ran[:SLOWEST]
        ],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=8, help="pytest-xdist workers on the one GPU (default 8)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE,
        help=f"the kernel cache the suite reads and fills (default {DEFAULT_CACHE})",
    )
    parser.add_argument("--cold", action="store_true", help="time from empty caches: --cache-dir must be empty")
    parser.add_argument(
        "--vllm-python",
        help="interpreter with a CUDA vLLM (GDNCTL_TEST_VLLM_PYTHON) for the rl tests on vLLM; without it they skip",
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=Path("gpu-suite-logs"),
        help="pytest's output, each test's record and the GPU tests' launch logs (default gpu-suite-logs)",
    )
    parser.add_argument(
        "--tests",
        default=str(REPO / "tests"),
        help="what pytest collects: a path or node id (default this repository's tests)",
    )
    parser.add_argument("--out", type=Path, help="write the result as JSON here too")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    args.cache_dir = args.cache_dir.expanduser().resolve()
    if Path(args.tests.split("::")[0]).exists():  # pytest runs from the repository: a path given from here
        path, _, node = args.tests.partition("::")
        args.tests = str(Path(path).resolve()) + (f"::{node}" if node else "")
    if args.cache_dir.exists() and not args.cache_dir.is_dir():
        parser.error(f"--cache-dir {args.cache_dir} is a file; name a directory (the suite fills it)")
    if args.cold and args.cache_dir.exists() and any(args.cache_dir.iterdir()):
        parser.error(
            f"--cold needs an empty --cache-dir, and {args.cache_dir} holds files; name a new directory "
            "(the suite fills it) or leave out --cold"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.log_dir = args.log_dir.resolve()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    report, log, launches = args.log_dir / "tests.jsonl", args.log_dir / "pytest.log", args.log_dir / "launches"
    report.unlink(missing_ok=True)
    shutil.rmtree(launches, ignore_errors=True)  # this run's launch logs only
    here = str(Path(__file__).resolve().parent)
    env = {
        **os.environ,
        **cache_env(args.cache_dir),
        "GDNCTL_GPU_LOG_DIR": str(launches),
        REPORT_ENV: str(report),
        "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
    }
    if args.vllm_python:
        env["GDNCTL_TEST_VLLM_PYTHON"] = args.vllm_python
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-v",
        "-rA",
        "-m",
        "gpu",
        "-n",
        str(args.workers),
        "--dist",
        "loadgroup",
        "-p",
        "gpu_suite",
        args.tests,
    ]
    cache_before = tree_bytes(args.cache_dir)
    print("$ " + shlex.join(command), flush=True)
    started = time.monotonic()
    with (
        subprocess.Popen(
            command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        ) as proc,
        log.open("w", buffering=1) as kept,
    ):
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            kept.write(line)
    wall = time.monotonic() - started
    tests = test_records(report)
    if not tests:
        print(f"pytest wrote no report (exit {proc.returncode}); see {log}", file=sys.stderr)
        return proc.returncode or 1
    result = {
        "device": device_name(),
        "versions": versions(args.vllm_python),
        "command": shlex.join(command),
        "workers": args.workers,
        "cache": {
            "dir": str(args.cache_dir),
            "cold": args.cold,
            "bytes_before": cache_before,
            "bytes_after": tree_bytes(args.cache_dir),
        },
        **summarise(wall, proc.returncode, tests),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
