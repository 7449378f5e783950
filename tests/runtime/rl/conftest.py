"""Fixtures the CPU policy tests share: the tiny CPU rl preset's engine config, and a one-rank gloo group."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch.distributed as dist

from gdnctl.schema.engine import EngineConfig


@pytest.fixture
def engine(tmp_path) -> EngineConfig:
    rendered = subprocess.run([sys.executable, "-m", "gdnctl", "render", "tiny-qwen3.5-rl-cpu", "-o",
                               str(tmp_path / "run")], text=True, capture_output=True, check=False)
    assert rendered.returncode == 0, rendered.stderr
    return EngineConfig.from_file(tmp_path / "run" / "engine.yaml")


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
