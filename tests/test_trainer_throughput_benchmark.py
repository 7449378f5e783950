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


def test_each_measured_step_under_pressure_follows_an_unmeasured_step_of_its_own_variant():
    """The guard's clear path empties the allocator cache and the next step pays to refill it: a pressured variant's
    measured step must not inherit that cost from a neighbour that cleared."""
    benchmark = load_benchmark()
    names = ["fla/guard-off", "fla/guard-always", "fla/guard-off/pressure", "fla/guard-always/pressure"]
    plan = benchmark.step_plan([benchmark.Variant.parse(name) for name in names], rounds=3)
    for name in names:
        assert sum(step.measured for step in plan if step.variant.name == name) == 3
    for before, step in zip(plan, plan[1:]):
        if step.measured and step.variant.pressure:
            assert before == benchmark.PlannedStep(step.variant, measured=False)
    # Unpressured steps leave the cache alone: one warm-up round, then every step counts.
    unpressured = [step for step in plan if not step.variant.pressure]
    assert [step.measured for step in unpressured] == [False] * 2 + [True] * 6
    # Pressured steps come after every unpressured one.
    assert all(not step.variant.pressure for step in plan[: len(unpressured)])


def test_speed_options_mode_turns_off_every_option_the_plan_decides():
    from gdnctl.plan.speed import SPEED_OPTIONS

    assert list(load_benchmark().SPEED_OFF) == list(SPEED_OPTIONS)


def test_compare_late_half_is_the_median_of_the_last_half_of_the_measured_steps():
    """A loop that speeds up late (steps 0.80 s early, 0.74 s late) shows its late pace apart from the whole median."""
    late_half = load_benchmark().late_half
    assert late_half([0.80, 0.80, 0.80, 0.74, 0.74, 0.73]) == 0.74
    assert late_half([0.80, 0.80, 0.80, 0.80, 0.74, 0.74, 0.73]) == 0.74  # an odd count: the middle step counts as late


def test_compare_refuses_a_kernel_name_it_cannot_run_before_any_launch():
    import subprocess

    done = subprocess.run(
        [sys.executable, str(SCRIPT), "compare", "--kernels", "flashqla", "--peer-kernels", "fla,flash-qla"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "'fla,flash-qla': name GDN kernels from fla, flashqla" in done.stderr
    assert "$ " not in done.stdout  # no launch was started
