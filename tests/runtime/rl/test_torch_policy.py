"""The CPU rl policy on a real (one-rank gloo) process group: micro-batching does not change the step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gdnctl.runtime.rl import batch as rl_batch
from gdnctl.runtime.rl.batch import Sample
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


def samples() -> list[Sample]:
    rows = [((81, 58, 32), (49, 50, 256)), ((81, 58), (55, 56, 57, 58)), ((81, 58, 32, 51), (52,)),
            ((70, 71), (48, 49))]
    return [Sample(i // 2, prompt, response, tuple(-5.5 for _ in response), "stop", 0.0, [1.0, -1.0, 0.5, -0.5][i])
            for i, (prompt, response) in enumerate(rows)]


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_one_step_is_the_same_in_one_or_several_micro_batches(engine, gloo, aggregation):
    from gdnctl.runtime.rl.torch_policy import TorchPolicy

    settings = engine.grpo.model_copy(update={"aggregation": aggregation})
    results = []
    for size in (4, 1, 3):
        policy = TorchPolicy(engine)
        parts = [rl_batch.build_batch(part, pad_id=256) for part in rl_batch.micro_batches(samples(), size)]
        stats = policy.train_step(parts, settings)
        results.append((stats, dict(policy.hf_tensors())))
    (whole, weights), *split = results
    assert whole["tokens"] == sum(len(s.prompt) + len(s.response) for s in samples())
    for stats, after in split:
        assert stats["loss"] == pytest.approx(whole["loss"], rel=1e-5, abs=1e-7)
        assert stats["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
        # Adam's first step moves each weight by about lr (3e-3) whatever the gradient's size, so elements with
        # near-zero gradients amplify summation-order noise: compare at 3% of a step.
        for name, tensor in after.items():
            torch.testing.assert_close(tensor, weights[name], rtol=0, atol=1e-4)


def test_export_writes_what_the_rollout_reads_and_probe_scores_the_sequence(engine, gloo, tmp_path: Path):
    from gdnctl.runtime.rl.torch_policy import TorchPolicy
    from gdnctl.runtime.rl.weight_sync import WEIGHTS_FILE

    policy = TorchPolicy(engine)
    written = policy.export(tmp_path / "weights")
    assert (tmp_path / "weights" / WEIGHTS_FILE).is_file() and (tmp_path / "weights" / "config.json").is_file()
    assert "lm_head.weight" not in written  # tied to the embedding
    assert all(t.dtype == torch.bfloat16 for t in written.values())
    probe = policy.probe_logprobs([81, 58, 32, 49])
    assert len(probe) == 3 and all(p < 0 for p in probe)


def _with_kl(engine: EngineConfig, **train) -> EngineConfig:
    return engine.model_copy(update={"grpo": engine.grpo.model_copy(update={"kl_coef": 0.1}),
                                     "train": engine.train.model_copy(update=train)})


def test_kl_is_zero_at_the_start_then_grows_and_is_aggregated_like_the_loss(engine, gloo):
    from gdnctl.runtime.rl.torch_policy import TorchPolicy

    config = _with_kl(engine)
    kls = {}
    for size in (4, 1):
        policy = TorchPolicy(config)
        parts = [rl_batch.build_batch(part, pad_id=256) for part in rl_batch.micro_batches(samples(), size)]
        first = policy.train_step(parts, config.grpo)
        second = policy.train_step(parts, config.grpo)
        kls[size] = (first["kl"], second["kl"])
    # The reference is the starting policy itself: identical log-probs, so k3 is exactly 0 on step 1.
    assert kls[4][0] == 0.0 and kls[1][0] == 0.0
    assert kls[4][1] > 0.0
    # Micro-batches are weighted by their share of the batch, so the split does not change the batch's KL.
    assert kls[1][1] == pytest.approx(kls[4][1], rel=1e-3)


def test_a_resumed_policy_keeps_the_first_start_as_its_kl_reference(engine, gloo, tmp_path: Path):
    from gdnctl.runtime.rl.torch_policy import TorchPolicy

    config = _with_kl(engine, save_dir=str(tmp_path / "ckpt"))
    first = TorchPolicy(config)
    start = {name: tensor.clone() for name, tensor in first.module.state_dict().items()}
    first.train_step([rl_batch.build_batch(samples(), pad_id=256)], config.grpo)
    first.save(tmp_path / "ckpt", 1)

    resumed = TorchPolicy(config)
    assert resumed.step == 1
    reference = resumed.reference.state_dict()
    current = resumed.module.state_dict()
    moved = [name for name in start if not torch.equal(current[name], start[name])]
    assert moved, "the resumed policy should hold the trained weights"
    for name, tensor in start.items():
        torch.testing.assert_close(reference[name], tensor, rtol=0, atol=0)


def test_moe_experts_leave_per_expert_and_come_back_fused(engine, gloo, tmp_path: Path):
    """transformers keeps experts fused; the export names them per expert (as checkpoints and vLLM do), and a
    policy loaded from that export holds the same weights."""
    from gdnctl.knowledge.catalog import from_catalog
    from gdnctl.runtime.rl.torch_policy import TorchPolicy

    moe = engine.model_copy(update={"model": from_catalog("gdnctl/tiny-qwen3.5-moe-bytes")})
    policy = TorchPolicy(moe)
    written = policy.export(tmp_path / "weights")
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in written
    assert not any(name.endswith(("experts.gate_up_proj", "experts.down_proj")) for name in written)
    fused = policy.module.state_dict()["model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(written["model.layers.0.mlp.experts.3.up_proj.weight"],
                       fused[3, fused.shape[1] // 2:].bfloat16())

    reloaded = TorchPolicy(moe.model_copy(update={"model": moe.model.model_copy(
        update={"path": str(tmp_path / "weights")})}))
    for name, tensor in policy.module.state_dict().items():
        torch.testing.assert_close(reloaded.module.state_dict()[name], tensor.bfloat16().float(), rtol=0, atol=0)


def test_a_step_whose_gradients_are_not_finite_is_not_applied(engine, gloo):
    """Adam's first step moves every weight by about lr: at 1e30 the next forward overflows fp32 and the loss and
    gradients are NaN. That step must leave the weights as they were and say what was not finite."""
    from gdnctl.runtime.rl.torch_policy import TorchPolicy

    config = engine.model_copy(update={"train": engine.train.model_copy(update={"lr": 1e30})})
    policy = TorchPolicy(config)
    parts = [rl_batch.build_batch(samples(), pad_id=256)]
    first = policy.train_step(parts, config.grpo)
    assert first["applied"] and first["loss_finite"] and first["grad_finite"]
    before = {name: tensor.clone() for name, tensor in policy.module.state_dict().items()}
    second = policy.train_step(parts, config.grpo)
    assert not second["applied"]
    assert not (second["loss_finite"] and second["grad_finite"])
    assert second["parameter_count"] == len(list(policy.module.parameters()))
    assert second["grad_finite"] or second["bad_parameters"]
    for name, tensor in policy.module.state_dict().items():
        assert torch.equal(tensor, before[name]), name
