"""benchmarks/trainer_throughput.py's context-parallel arms are presets `gdnctl validate` accepts on 2 H200s, so a
lent 2-GPU machine's time goes to the run and not to a refused preset."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gdnctl.cli import app

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "trainer_throughput.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("trainer_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cp", [1, 2])
def test_each_context_parallel_arm_validates_on_two_h200s(cp):
    benchmark = load_benchmark()
    args = argparse.Namespace(set=["cluster.gpu=h200"], gpus=2, seq_length=32768, steps=6)
    sets = benchmark.context_parallel_sets(args, cp)
    assert f"parallel.cp={cp}" in sets and "train.layout=thd" in sets
    options = [option for value in sets for option in ("--set", value)]
    result = CliRunner().invoke(app, ["validate", benchmark.PRESET, *options, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]
