"""benchmarks/rl_async.py's arms are settings `gdnctl validate` accepts, its figures are what its docstring says,
and benchmarks/rl_timeline.py writes a PNG that a PNG reader takes."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gdnctl.cli import app

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("arm", ["sync", "off-policy", "partial"])
def test_every_arm_validates(arm):
    benchmark = load("rl_async")
    sets = (*benchmark.SEPARATE, *benchmark.ARMS[arm], "train.train_iters=20", f"rollout.python={sys.executable}")
    result = CliRunner().invoke(
        app, ["validate", benchmark.PRESET, "--json", *(a for value in sets for a in ("--set", value))]
    )
    report = json.loads(result.output)
    assert result.exit_code == 0 and report["ok"], report["findings"]


def _step(step: int, rollout: tuple[float, float], train: tuple[float, float], busy: float) -> dict:
    return {
        "step": step,
        "rollout_began_s": rollout[0],
        "rollout_ended_s": rollout[1],
        "train_began_s": train[0],
        "train_ended_s": train[1],
        "sync_began_s": train[1],
        "sync_ended_s": train[1] + 1,
        "rollout_busy_s": busy,
        "reward_mean": 0.1 * step,
        "staleness_max": min(step - 1, 1),
        "continued_samples": 0,
    }


def test_the_figures_come_from_the_timeline():
    """Two overlapped steps: step 2's rollout (4-8 s) runs under step 1's update (2-9 s)."""
    steps = [_step(1, (0, 2), (2, 9), 2.0), _step(2, (4, 8), (10, 17), 6.0)]
    figures = load("rl_async").summary(steps)
    assert figures["wall_s"] == 18 and figures["step_s"] == 8
    assert figures["trainer_idle_share"] == pytest.approx(2 / 18)  # it waited only for step 1's batch, 0-2 s
    assert figures["rollout_idle_share"] == pytest.approx(1 - 6 / 18)
    assert figures["overlapped_steps"] == 1 and figures["staleness_max"] == 1
    assert figures["reward"] == [0.1, 0.2]


def test_the_timeline_is_a_png(tmp_path):
    timeline = load("rl_timeline")
    run = tmp_path / "run"
    run.mkdir()
    steps = [_step(1, (0, 2), (2, 9), 2.0), _step(2, (4, 8), (10, 17), 6.0)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    out = tmp_path / "figure.png"
    timeline.draw([("MAX_STALENESS 1", timeline.steps_of(run, None))], out, width=400)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack("!II", data[16:24])
    assert width == 400 and height > 100
    idat = data.index(b"IDAT")
    (length,) = struct.unpack("!I", data[idat - 4 : idat])
    raw = zlib.decompress(data[idat + 4 : idat + 4 + length])
    assert len(raw) == height * (1 + 3 * width)  # one filter byte and RGB pixels per row
    assert len(set(raw)) > 3  # something is drawn
