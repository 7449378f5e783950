"""rl with train.lora on GPUs (runtime/rl/policy/megatron_policy.py): megatron-bridge's LoRA on a frozen base, the
rollout given whole weights with the adapters merged in, the KL reference the base with the adapters switched off.

- The policy alone (tests/gpu/rl_lora_check.py, no vLLM): before any step the export is the base; after two GRPO
  steps every transport's tensors are the same (the disk export, `hf_tensors` for CUDA IPC and broadcast, a second
  export), each adapted weight is base + (alpha / rank)·B·A and every other the base's, the frozen base is
  untouched by the steps and the exports; the reference scores the probe as the starting policy did, also after a
  resume; the last checkpoint's merged model is what the rollout was sent.
- With GPU vLLM, colocated (GDNCTL_TEST_VLLM_PYTHON as in test_rl_vllm_gpu.py): 20 GRPO steps through CUDA IPC
  with the reward rising, every sync checked by the job itself (per-parameter checksums, the probe), and with the
  disk transport the rollout's last
  weights are the last checkpoint's merged model, which differs from the base where adapters sit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.gpu.test_trainer_gpu import NEEDS_BRIDGE_STACK, _record

VLLM_PYTHON = os.environ.get("GDNCTL_TEST_VLLM_PYTHON")
HERE = Path(__file__).parent

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core"),
    NEEDS_BRIDGE_STACK,
]
NEEDS_VLLM = pytest.mark.skipif(not VLLM_PYTHON, reason="GDNCTL_TEST_VLLM_PYTHON is not set (no GPU vLLM environment)")


@pytest.fixture(scope="module")
def policy_check(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("rl_lora_policy")
    proc = subprocess.run(
        [sys.executable, str(HERE / "rl_lora_check.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    _record("rl_lora_policy", result)
    return result


def test_every_transport_sends_the_merged_weights_and_the_model_keeps_its_base(policy_check):
    result = policy_check
    assert result["adapted"], "no adapter on any HF weight"
    # lora_B starts at zero: the first sync sends the base as it was loaded.
    assert result["start_export_max_abs_diff"] == 0.0
    assert result["exported_names_match"]
    assert result["shared_differs_from_export"] == []  # CUDA IPC / broadcast send the disk export's tensors
    assert result["second_export_differs"] == []  # exporting twice does not merge twice
    assert result["frozen_changed"] == []  # the merge works on copies
    for name, (error, delta) in result["merged_error"].items():
        assert delta > 0, name  # the trained adapter moves the weight
        assert error < 0.1 * delta, (name, error, delta)  # bf16 rounding of the sum, far below the adapter's part
    assert all(diff == 0.0 for diff in result["untouched_max_abs_diff"].values()), result["untouched_max_abs_diff"]


def test_the_kl_reference_is_the_base_also_after_a_resume(policy_check):
    result = policy_check
    kl_first, kl_second = result["kl"]
    # Step 1: the policy is the base plus zero-initialised adapters, the reference the base: no divergence yet.
    assert abs(kl_first) < 1e-6 and kl_second > 10 * abs(kl_first) and kl_second > 0, result["kl"]
    assert result["probe_reference_vs_start"] < 1e-6
    assert result["probe_trained_vs_start"] > 100 * max(result["probe_reference_vs_start"], 1e-7)
    assert result["resumed_step"] == 2
    assert result["resumed_adapter_names_match"] and result["resumed_adapters_differ"] == []
    assert result["resumed_probe_reference_vs_start"] < 1e-6
    assert result["checkpoint_differs_from_export"] == []


def _launch(run_dir: Path, *sets: str) -> subprocess.CompletedProcess:
    from tests.gpu.test_rl_vllm_gpu import ON_GPU, PRESET, _keep_log

    # The megatron-bridge builder (LoRA needs it), else the rl GPU tests' settings.
    on_gpu = [value for value in ON_GPU if not value.startswith("runtime.transformer_engine=")]
    values = [*on_gpu, "runtime.transformer_engine=2.20.2", f"rollout.python={VLLM_PYTHON}", *sets]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gdnctl",
            "launch",
            PRESET,
            "-o",
            str(run_dir),
            "--force",
            *(arg for value in values for arg in ("--set", value)),
        ],
        text=True,
        capture_output=True,
        timeout=1500,
        check=False,
    )
    _keep_log(run_dir, done.stdout + done.stderr)
    return done


PROBE_GAP = 0.08  # nats/token, what the job's checked syncs must stay within here (see _lora_run)


def _lora_run(tmp_path: Path, name: str, steps: int, *sets: str, lr: str = "1e-3") -> tuple[Path, Path, list[dict]]:
    from tests.gpu.test_rl_vllm_gpu import metrics
    from tests.runtime.rl.tiny_model import random_checkpoint

    base = tmp_path / "base"
    if not base.exists():
        random_checkpoint(base, seed=7, init_std=0.2)
    run_dir, save_dir = tmp_path / name, tmp_path / f"{name}-ckpt"
    done = _launch(
        run_dir,
        f"model.path={base}",
        "train.lora={rank: 8, alpha: 16}",
        f"train.lr={lr}",
        "grpo.kl_coef=0.05",
        f"train.train_iters={steps}",
        f"train.save_dir={save_dir}",
        *sets,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    steps_seen = metrics(run_dir)
    assert [s["step"] for s in steps_seen] == list(range(1, steps + 1))
    # The job checks every sync itself (checksums per rollout parameter, the probe) and stops on a mismatch.
    assert all(s["synced_parameters"] > 0 for s in steps_seen)
    # Transformer Engine's trainer against vLLM on this base (init std 0.2, large logits) scores the probe 0.037-0.069
    # nats/token apart over 20 steps on an H100, 0.048 before any adapter moved; an engine left on other weights is
    # 0.18-0.4 away (runtime/rl/weights/sync.py). The job's own bound is rollout.probe_tolerance (0.1).
    assert all(s["probe_logprob_abs_diff"] < PROBE_GAP for s in steps_seen), [
        s["probe_logprob_abs_diff"] for s in steps_seen
    ]
    assert all(s["kl"] is not None for s in steps_seen)
    return run_dir, save_dir, steps_seen


@NEEDS_VLLM
def test_colocated_lora_rl_learns_over_20_steps_with_every_sync_through_cuda_ipc(tmp_path):
    from tests.runtime.rl.test_rl_vllm import first_and_last_rewards

    # Adapters on a random base move the policy only slowly at a fine-tuning lr (tests/gpu/lora_check.py).
    _, save_dir, steps = _lora_run(tmp_path, "ipc", 20, lr="1e-2")
    assert {s["weight_transport"] for s in steps} == {"cuda_ipc"}
    first, last_rewards = first_and_last_rewards(steps)
    assert last_rewards > first + 0.02, [round(s["reward_mean"], 3) for s in steps]
    last = save_dir / "iter_0000020"
    assert (last / "adapter" / "adapter_model.safetensors").is_file()
    assert (last / "model.safetensors.index.json").is_file()


@NEEDS_VLLM
def test_the_rollouts_last_weights_are_the_last_checkpoints_merged_model(tmp_path):
    from gdnctl.runtime.model.checkpoint import HFReader

    run_dir, save_dir, steps = _lora_run(tmp_path, "disk", 3, "rollout.weight_sync=disk")
    assert {s["weight_transport"] for s in steps} == {"disk"}
    rollout, merged, base = (
        HFReader(run_dir / "rollout" / "weights"),
        HFReader(save_dir / "iter_0000003"),
        HFReader(tmp_path / "base"),
    )
    assert sorted(rollout.locations) == sorted(merged.locations)
    assert all(torch.equal(rollout.get(name), merged.get(name)) for name in merged.locations)
    targets = set(
        json.loads((save_dir / "iter_0000003" / "adapter" / "adapter_config.json").read_text())["target_modules"]
    )
    adapted = [name for name in merged.locations if name.rsplit(".", 2)[-2] in targets]
    assert adapted and any(not torch.equal(merged.get(name), base.get(name)) for name in adapted)
    for name in sorted(set(merged.locations) - set(adapted)):
        got, was = merged.get(name).float(), base.get(name).float()
        # The bridge maps zero-centred norms as w - 1 and back (a bf16 rounding at 1 at most); the rest is the base.
        assert torch.equal(got, was) or (
            "norm" in name and (got - was).abs().max() <= 2**-7 * max(1.0, was.abs().max().item())
        ), name
