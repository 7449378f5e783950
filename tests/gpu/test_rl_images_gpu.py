"""rl's image prompts on GPU vLLM: the tiny vision-language model served with its vision tower, an image prompt
expanded, scored and sampled as transformers' vision-language class scores it on the same weights, the tower's
checksums compared, and a sync of another tower seen by the probe.

The engine alone: validate refuses rl with images on GPUs (IMG004), because gdnctl's GPU trainer builds no vision
tower yet, so the engine config is the GPU text preset's with train.images added, as an rl job on image prompts
would render it. GDNCTL_TEST_VLLM_PYTHON names an interpreter whose environment has a CUDA vLLM and gdnctl.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import yaml

from tests.runtime.rl.test_rl_vllm import PRESET, VL_BYTES, check_the_image_engine

# The GPU rl tests' settings (tests/gpu/test_rl_vllm_gpu.py ON_GPU), without the trainer's.
ON_GPU = (
    "cluster.gpu=h100",
    "runtime.transformer_engine=none",
    "runtime.vllm=0.26.0",
    "kernels.gdn_backend=fla",
    "rollout.gpu_memory_utilization=0.1",
    "rollout.kv_cache_gib=2",
    "rollout.enforce_eager=true",
    "rollout.gdn_prefill_backend=triton",
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        not os.environ.get("GDNCTL_TEST_VLLM_PYTHON"), reason="GDNCTL_TEST_VLLM_PYTHON is not set (no GPU vLLM)"
    ),
]


def test_gpu_vllm_serves_an_image_prompt_as_the_trainer_scores_it(tmp_path):
    """Measured on one H200 with vLLM 0.26.0 (2026-12-02): probe 0.028, 12 sampled tokens at T = 0.7 0.046, and 0.53
    after a sync of another tower; every tower parameter matched by checksum."""
    run_dir = tmp_path / "run"
    sets = [arg for value in (*ON_GPU, f"model.id={VL_BYTES}") for arg in ("--set", value)]
    rendered = subprocess.run(
        [sys.executable, "-m", "gdnctl", "render", PRESET, "-o", str(run_dir), *sets],
        text=True,
        capture_output=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    engine_yaml = run_dir / "engine.yaml"
    config = yaml.safe_load(engine_yaml.read_text())
    assert config["device"] == "cuda"
    config["train"]["images"] = {"max_per_sample": 1, "max_bytes": 1 << 20, "max_pixels": 4096}
    engine_yaml.write_text(yaml.safe_dump(config))
    gaps = check_the_image_engine(run_dir, tmp_path)
    log_dir = os.environ.get("GDNCTL_GPU_LOG_DIR")
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        with open(os.path.join(log_dir, "rl_images_gpu.gaps.txt"), "w") as handle:
            handle.write(repr(gaps) + "\n")
