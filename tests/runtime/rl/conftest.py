"""Fixtures the rl tests share: the tiny CPU rl preset's engine config, a one-rank gloo group, one rl job run as a
real Slurm job, and the jobs several tests read."""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch.distributed as dist

from gdnctl.schema.engine import EngineConfig

# The Slurm rl job's settings; the requeue test (test_rl_requeue.py) submits the same job and kills it midway, so
# the uninterrupted one is the curve a requeued job must continue. Small steps: the requeue test pays two more vLLM
# engine starts. Enough of them that its requeue lands before the end: a step takes ~0.3 s on a fast CI machine
# (2026-11-25: an AMD EPYC ran steps 1-4 of a 4-step run within 1 s, so the requeue after step 3 found the job done
# and it resumed at step 4).
SLURM_STEPS = 12
SLURM_SETTINGS = (
    f"train.train_iters={SLURM_STEPS}",
    "train.save_interval=2",
    "train.global_batch_size=16",
    "train.micro_batch_size=16",
    "rollout.n_samples_per_prompt=4",
    "launch.slurm.exclusive=false",
)


@pytest.fixture
def engine(tmp_path) -> EngineConfig:
    rendered = subprocess.run(
        [sys.executable, "-m", "gdnctl", "render", "tiny-qwen3.5-rl-cpu", "-o", str(tmp_path / "run")],
        text=True,
        capture_output=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    return EngineConfig.from_file(tmp_path / "run" / "engine.yaml")


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def slurm_rl_run(tmp_path_factory, local_slurm) -> tuple[Path, subprocess.CompletedProcess]:
    """The tiny rl preset run start to end as a real Slurm job (`launch --slurm --wait`) with SLURM_SETTINGS and
    a save dir: its run dir and the launch's result. Run once for the tests that read it (that rl runs under
    Slurm, and what a requeued job is compared with), each a vLLM engine start fewer."""
    from tests.runtime.rl.test_rl_vllm import PRESET, VLLM_PYTHON, vllm_env
    from tests.slurm_cluster import slurm_env

    run_dir = tmp_path_factory.mktemp("slurm-rl") / "run"
    sets = (
        f"rollout.python={VLLM_PYTHON}",
        f"train.save_dir={run_dir / 'checkpoints'}",
        "launch.slurm.time=00:15:00",
        *SLURM_SETTINGS,
    )
    command = [
        sys.executable,
        "-m",
        "gdnctl",
        "launch",
        PRESET,
        "--slurm",
        "--wait",
        "-o",
        str(run_dir),
        *(arg for value in sets for arg in ("--set", value)),
    ]
    env = vllm_env(base=slurm_env(local_slurm))  # the requeue test's job runs vLLM the same way
    done = subprocess.run(command, text=True, capture_output=True, timeout=900, env=env, check=False)
    return run_dir, done


# The PPO job's settings: four mini-batch updates per rollout batch, with rollout correction, sampled at temperature
# 0.7. The PPO test (test_rl_vllm.py) reads its updates and clip, the temperature test (test_rl_async.py) its
# trainer-vs-engine gaps, which are taken before the first update and so are the sampling policy's.
PPO_SETTINGS = ("grpo.mini_batches=4", "grpo.rollout_correction=true", "rollout.temperature=0.7")


@pytest.fixture(scope="session")
def ppo_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The tiny rl preset with PPO_SETTINGS, small steps, 3 steps and no evaluation: its run dir and the launch's
    result. Run once for the two tests that read it (tests/conftest.py keeps them on one xdist worker)."""
    from tests.runtime.rl.test_rl_vllm import SMALL_STEPS, launch

    run_dir = tmp_path_factory.mktemp("ppo") / "run"
    return run_dir, launch(run_dir, *SMALL_STEPS, *PPO_SETTINGS, "train.train_iters=3", "eval=null")


# The job whose second step is not finite (lr 1e30: Adam's first update moves every weight by ~1e30, so the second
# step's forward overflows fp32), saving after every step. The non-finite test (test_rl_vllm.py) reads where it
# stopped and what it saved, the process test (test_rollout_processes.py) that no process of its engine outlived it.
NONFINITE_SETTINGS = ("train.lr=1e30", "train.train_iters=4", "train.save_interval=1")


@dataclass(frozen=True)
class WatchedRun:
    run_dir: Path
    save_dir: Path
    done: subprocess.CompletedProcess
    seen: dict[int, str]  # pid -> command line of every process of the job seen while it ran
    left: dict[int, str]  # those still alive once the launch had returned, after the grace a killed one takes


@pytest.fixture(scope="session")
def nonfinite_run(tmp_path_factory) -> WatchedRun:
    """The tiny rl preset with small steps and NONFINITE_SETTINGS, its processes watched from the start to after the
    launch returned. Run once for the two tests that read it (tests/conftest.py keeps them on one xdist worker)."""
    from tests.runtime.rl.test_rollout_processes import Watch, after_the_job, launched

    base = tmp_path_factory.mktemp("nonfinite")
    run_dir, save_dir = base / "run", base / "checkpoints"
    marker = uuid.uuid4().hex
    watch = Watch(marker)
    with launched(run_dir, marker, *NONFINITE_SETTINGS, f"train.save_dir={save_dir}") as job:
        stdout, stderr = job.communicate(timeout=900)
    seen = watch.stop()
    done = subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)
    return WatchedRun(run_dir, save_dir, done, seen, after_the_job(marker))
