"""The CPU rl policy on a real (one-rank gloo) process group: micro-batching does not change the step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gdnctl.runtime.rl.algorithm import batch as rl_batch
from gdnctl.runtime.rl.algorithm.batch import Sample
from gdnctl.schema.engine import EngineConfig


def samples() -> list[Sample]:
    rows = [
        ((81, 58, 32), (49, 50, 256)),
        ((81, 58), (55, 56, 57, 58)),
        ((81, 58, 32, 51), (52,)),
        ((70, 71), (48, 49)),
    ]
    return [
        Sample(i // 2, prompt, response, tuple(-5.5 for _ in response), "stop", 0.0, [1.0, -1.0, 0.5, -0.5][i])
        for i, (prompt, response) in enumerate(rows)
    ]


# float32's unit roundoff: one rounding moves a value by at most this share of it.
UNIT_ROUNDOFF = 2.0**-24


# Roundings in torch's AdamW step, each relative to the step: m, v (two), the bias corrections (two), the square
# root, + eps, m / denominator, times lr, and the add into the weight.
ADAM_ROUNDINGS = 10


def _gradient_bound(whole: dict[str, torch.Tensor], reduction_length: int) -> dict[str, float]:
    """How far one gradient tensor may move when the same terms are summed in another order: a float sum of n
    terms is off its exact value by at most (n - 1) * u * (sum of |terms|) (Higham, Accuracy and Stability of
    Numerical Algorithms, 2nd ed., section 4.2). Each gradient element is a sum over the batch's tokens of
    products that are themselves sums over the widest layer, so n is at most tokens * width; the sum of |terms|
    is bounded by the tensor's largest element times n, which is loose where terms cancel but never too tight.
    Both orders carry that error, hence the factor 2."""
    return {name: 2 * reduction_length * UNIT_ROUNDOFF * float(grad.abs().max()) for name, grad in whole.items()}


def _adam_first_step(grad: torch.Tensor, eps: float) -> torch.Tensor:
    """AdamW's first update over lr: the bias corrections make m-hat = g and v-hat = g * g, so each weight moves
    by lr * g / (|g| + eps), about lr whatever the gradient's size. An element whose gradient is near zero turns a
    tiny gradient difference into a large step difference, so the weights are compared against this, not at a
    flat tolerance."""
    return grad / (grad.abs() + eps)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_one_step_is_the_same_in_one_or_several_micro_batches(engine, gloo, aggregation):
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

    settings = engine.grpo.model_copy(update={"aggregation": aggregation})
    results = []
    for size in (4, 1, 3):
        policy = TorchPolicy(engine)
        parts = [rl_batch.build_batch(part, pad_id=256) for part in rl_batch.micro_batches(samples(), size)]
        stats = policy.train_step(parts, settings)
        # The gradients stay on the parameters after the step: what (after clipping) Adam was given.
        named = dict(policy.module.named_parameters())
        results.append(
            (
                stats,
                {name: p.detach().clone() for name, p in named.items()},
                {name: p.grad.detach().clone() for name, p in named.items() if p.grad is not None},
            )
        )
    group = policy.optimizer.param_groups[0]
    lr, eps = group["lr"], group["eps"]
    (whole, weights, grads), *split = results
    tokens = sum(len(s.prompt) + len(s.response) for s in samples())
    assert whole["tokens"] == tokens
    width = max(max(t.shape) for t in weights.values())
    bounds = _gradient_bound(grads, tokens * width)
    for stats, after, after_grads in split:
        # The loss is summed in float64 from float32 per-micro-batch means: a few float32 roundings apart.
        assert stats["loss"] == pytest.approx(whole["loss"], rel=tokens * UNIT_ROUNDOFF, abs=1e-7)
        assert after_grads.keys() == grads.keys()
        for name, grad in after_grads.items():
            torch.testing.assert_close(grad, grads[name], rtol=0, atol=bounds[name], msg=name)
        norm_bound = sum(b * b * g.numel() for b, g in zip(bounds.values(), grads.values(), strict=True)) ** 0.5
        assert abs(stats["grad_norm"] - whole["grad_norm"]) <= norm_bound
        for name, tensor in after.items():
            # What the measured gradient difference makes of Adam's step (in float64, exact enough), plus each
            # run's own roundings: ADAM_ROUNDINGS on the way to the step (relative to lr), three on the weight
            # (decay, then w - step).
            step_gap = (
                lr
                * (
                    _adam_first_step(after_grads[name].double(), eps) - _adam_first_step(grads[name].double(), eps)
                ).abs()
            )
            allowed = step_gap + 2 * UNIT_ROUNDOFF * (ADAM_ROUNDINGS * lr + 3 * weights[name].abs().double())
            excess = ((tensor.double() - weights[name].double()).abs() - allowed).max()
            assert excess <= 0, f"{name}: weights differ by {float(excess):.3g} more than the gradients explain"


def test_export_writes_what_the_rollout_reads_and_probe_scores_the_sequence(engine, gloo, tmp_path: Path):
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy
    from gdnctl.runtime.rl.weights.sync import WEIGHTS_FILE

    policy = TorchPolicy(engine)
    written = policy.export(tmp_path / "weights")
    assert (tmp_path / "weights" / WEIGHTS_FILE).is_file() and (tmp_path / "weights" / "config.json").is_file()
    assert "lm_head.weight" not in written  # tied to the embedding
    assert all(t.dtype == torch.bfloat16 for t in written.values())
    probe = policy.probe_logprobs([81, 58, 32, 49])
    assert len(probe) == 3 and all(p < 0 for p in probe)


def _with_kl(engine: EngineConfig, **train) -> EngineConfig:
    return engine.model_copy(
        update={"grpo": engine.grpo.model_copy(update={"kl_coef": 0.1}), "train": engine.train.model_copy(update=train)}
    )


def test_kl_is_zero_at_the_start_then_grows_and_is_aggregated_like_the_loss(engine, gloo):
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

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
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

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


def _digests(directory: Path) -> dict[str, str]:
    import hashlib

    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def test_no_save_replaces_the_checkpoint_the_policy_started_from(engine, gloo, tmp_path: Path):
    """A checkpoint of an earlier run's save dir as model.path: a fresh start in that save dir is refused before
    anything is written, and a save that would land on it (the step of its name) is refused too."""
    from gdnctl.runtime.model.checkpoint import CheckpointError
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

    save_dir = tmp_path / "save"
    earlier = TorchPolicy(_with_kl(engine, save_dir=str(save_dir)))
    earlier.train_step([rl_batch.build_batch(samples(), pad_id=256)], engine.grpo)
    earlier.save(save_dir, 1)
    source = save_dir / "iter_0000001"
    (save_dir / "latest").unlink()  # a fresh start in the same save dir
    before = _digests(source)
    inside = _with_kl(engine, save_dir=str(save_dir)).model_copy(
        update={"model": engine.model.model_copy(update={"path": str(source)})}
    )
    with pytest.raises(CheckpointError, match=f"model.path {source} is inside train.save_dir {save_dir}"):
        TorchPolicy(inside)
    elsewhere = _with_kl(engine, save_dir=str(tmp_path / "other")).model_copy(
        update={"model": engine.model.model_copy(update={"path": str(source)})}
    )
    policy = TorchPolicy(elsewhere)
    policy.train_step([rl_batch.build_batch(samples(), pad_id=256)], engine.grpo)
    with pytest.raises(CheckpointError, match="would replace the checkpoint this job reads its weights from"):
        policy.save(save_dir, 1)  # save_dir/iter_0000001 is its model.path
    assert _digests(source) == before


def test_moe_experts_leave_per_expert_and_come_back_fused(engine, gloo, tmp_path: Path):
    """transformers keeps experts fused; the export names them per expert (as checkpoints and vLLM do), and a
    policy loaded from that export holds the same weights."""
    from gdnctl.knowledge.catalog import from_catalog
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

    moe = engine.model_copy(update={"model": from_catalog("gdnctl/tiny-qwen3.5-moe-bytes")})
    policy = TorchPolicy(moe)
    written = policy.export(tmp_path / "weights")
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in written
    assert not any(name.endswith(("experts.gate_up_proj", "experts.down_proj")) for name in written)
    fused = policy.module.state_dict()["model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(
        written["model.layers.0.mlp.experts.3.up_proj.weight"], fused[3, fused.shape[1] // 2 :].bfloat16()
    )

    reloaded = TorchPolicy(
        moe.model_copy(update={"model": moe.model.model_copy(update={"path": str(tmp_path / "weights")})})
    )
    for name, tensor in policy.module.state_dict().items():
        torch.testing.assert_close(reloaded.module.state_dict()[name], tensor.bfloat16().float(), rtol=0, atol=0)


def test_a_step_whose_gradients_are_not_finite_is_not_applied(engine, gloo):
    """Adam's first step moves every weight by about lr: at 1e30 the next forward overflows fp32 and the loss and
    gradients are NaN. That step must leave the weights as they were and say what was not finite."""
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

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
