"""`gdnctl validate` wall time next to `python -c "import torch"`, in one run (target: ratio <= 0.2).

Each command runs as a fresh process, alternating, `--repeat` times; the medians are compared.
    python benchmarks/validate_startup.py [--preset qwen3.5-35b-a3b-grpo] [--repeat 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time


def _wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3.5-35b-a3b-grpo")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    # pip compiles an installed package's bytecode at install time; an editable checkout under
    # PYTHONDONTWRITEBYTECODE would recompile gdnctl's sources on every run, which no user pays.
    import compileall
    from pathlib import Path

    import gdnctl

    compileall.compile_dir(str(Path(gdnctl.__file__).parent), quiet=1)

    validate_cmd = [sys.executable, "-m", "gdnctl", "validate", args.preset]
    torch_cmd = [sys.executable, "-c", "import torch"]
    if subprocess.run(torch_cmd, capture_output=True).returncode != 0:
        sys.exit("torch is not importable here: pip install torch==2.13.0 (CPU) to compare against it")
    for command in (validate_cmd, torch_cmd):  # warm the page cache before timing
        _wall(command)
    validate_times, torch_times = [], []
    for _ in range(args.repeat):
        validate_times.append(_wall(validate_cmd))
        torch_times.append(_wall(torch_cmd))
    import torch  # noqa: E402  (only for the version in the record)

    result = {
        "validate_median_s": round(statistics.median(validate_times), 4),
        "import_torch_median_s": round(statistics.median(torch_times), 4),
        "ratio": round(statistics.median(validate_times) / statistics.median(torch_times), 3),
        "repeat": args.repeat,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "preset": args.preset,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"gdnctl validate {args.preset}: {result['validate_median_s'] * 1000:.0f} ms (median of {args.repeat})")
        torch_ms = result["import_torch_median_s"] * 1000
        print(f"python -c 'import torch':   {torch_ms:.0f} ms (torch {torch.__version__})")
        print(f"ratio: {result['ratio']:.3f} (target <= 0.2)")


if __name__ == "__main__":
    main()
