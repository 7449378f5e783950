"""benchmarks/rollout_engines.py's arms are settings `gdnctl validate` accepts on the machines they are meant for,
so a lent GPU machine's time goes to the runs and not to a refused preset."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gdnctl.cli import app

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "rollout_engines.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("rollout_engines", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_two_gpus_run_the_colocated_arms_and_three_add_the_separate_ones():
    benchmark = load_benchmark()
    assert [(placement, engines) for placement, engines, _ in benchmark.arms(2)] == [("colocated", 1), ("colocated", 2)]
    assert [(placement, engines) for placement, engines, _ in benchmark.arms(3)][2:] == [
        ("separate", 1),
        ("separate", 2),
    ]
    assert [(placement, engines) for placement, engines, _ in benchmark.arms(3, ("separate",))] == [
        ("separate", 1),
        ("separate", 2),
    ]


@pytest.mark.parametrize("arm", range(4))
def test_every_arm_validates_and_runs_the_engines_it_names(arm, tmp_path):
    benchmark = load_benchmark()
    placement, engines, settings = benchmark.arms(3)[arm]
    sets = (*benchmark.ON_GPU, *benchmark.load(), *settings, "train.train_iters=6", f"rollout.python={sys.executable}")
    result = CliRunner().invoke(
        app, ["validate", benchmark.PRESET, "--json", *(arg for value in sets for arg in ("--set", value))]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ok"], report["findings"]
    assert report["resolved"]["rollout_engines"] == engines, (placement, report["resolved"])


def test_an_arm_reads_its_engines_start_from_the_jobs_own_line():
    """rl/job.py logs `rollout engine up in S s` (one engine) or `rollout engines up in S s` (the slowest)."""
    read = load_benchmark().engine_start_seconds
    assert read("[gdnctl rl] rollout engine up in 257.0 s\nstep 1/3 | ...") == 257.0
    assert read("[gdnctl rl] rollout engines up in 61.4 s") == 61.4
    assert read("a job that never started its engines") is None


def test_results_name_the_rollout_interpreters_vllm_or_say_it_has_none():
    benchmark = load_benchmark()
    assert benchmark.vllm_version(sys.executable).startswith("unknown")
    vllm_python = os.environ.get("GDNCTL_TEST_VLLM_PYTHON")
    if vllm_python:  # tools/test.sh sets it to the vLLM CPU venv; CI has one
        assert re.fullmatch(r"vllm(-cpu)? \d+\.\d+\.\d+.*", benchmark.vllm_version(vllm_python))
