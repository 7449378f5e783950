"""Run by test_rl_policy_gpu.py in its own process (Megatron's parallel state is process-global).

    python tests/gpu/rl_policy_check.py OUT_DIR [BUILDER] [OVERRIDE ...]    (BUILDER: te-free | megatron-bridge;
                                                                           OVERRIDE: like --set, key=value)

The rl job's GPU policy (MegatronPolicy: the named builder's Megatron-Core model, bf16) against its CPU policy's code
(TorchPolicy: transformers' Qwen3.5 class, fp32, here on the same GPU), both loaded from one random HF
checkpoint of the byte-level tiny Qwen3.5 with the KL term on: the probe log-probs, the exported HF tensors,
two GRPO steps' loss, grad norm and KL on the same rows, then a MegatronPolicy resumed from the step-2
checkpoint, whose KL reference must still be the starting weights. The same transformers class in bf16 takes
step 1 as well: its grad norm is how far bf16 alone moves this step's gradient. Prints one JSON line with what it
measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

KL_COEF = 0.05

# Run as a script: the repository root (for tests.gpu and tests.runtime.rl) is not on sys.path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.process_group import init_check_process_group  # noqa: E402


def _samples():
    from gdnctl.runtime.rl.algorithm.batch import Sample

    generator = torch.Generator().manual_seed(0)
    samples = []
    for index in range(8):
        prompt = torch.randint(0, 256, (6 + index % 3,), generator=generator).tolist()
        response = torch.randint(0, 256, (5 + index % 4,), generator=generator).tolist()
        samples.append(
            Sample(
                index // 4,
                tuple(prompt),
                tuple(response),
                tuple(-5.5 for _ in response),
                "stop",
                0.0,
                [1.0, -1.0, 0.5, -0.5][index % 4],
            )
        )
    return samples


def _bf16_policy(config):
    """The CPU policy's code with its weights (and KL reference) cast to bf16, on the GPU."""
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

    policy = TorchPolicy(config, device="cuda")
    policy.module.to(torch.bfloat16)
    if policy.reference is not None:
        policy.reference.to(torch.bfloat16)
    return policy


def main(out_dir: str, builder: str = "te-free", *sets: str) -> None:
    torch.cuda.set_device(0)
    init_check_process_group(Path(out_dir), "cpu:gloo,cuda:nccl")
    from gdnctl.launch.render import render
    from gdnctl.runtime.comm.guard import CommGuardPolicy
    from gdnctl.runtime.rl.algorithm import batch as rl_batch
    from gdnctl.runtime.rl.policy.megatron_policy import MegatronPolicy
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy
    from gdnctl.schema.engine import EngineConfig
    from tests.runtime.rl.tiny_model import random_checkpoint

    out = Path(out_dir)
    loaded = random_checkpoint(out / "weights", seed=7, init_std=0.2)
    run_dir = out / "run"
    te = "none" if builder == "te-free" else "2.20.2"
    render(
        "tiny-qwen3.5-rl-cpu",
        run_dir,
        [
            "cluster.gpu=h100",
            f"model.path={out / 'weights'}",
            "kernels.gdn_backend=fla",
            "comm.memory_guard=false",
            f"grpo.kl_coef={KL_COEF}",
            f"train.save_dir={out / 'ckpt'}",
            f"runtime.transformer_engine={te}",
            *sets,
        ],
    )
    config = EngineConfig.from_file(run_dir / "engine.yaml")
    assert config.train.model_builder == builder, config.train.model_builder
    megatron = MegatronPolicy(config, run_dir / "engine.yaml", CommGuardPolicy.from_engine(config.comm, run_dir))
    reference = TorchPolicy(config, device="cuda")

    probe = list(b"Q: 24 + 48 = ? A: 72. Q: 26 + 2 = ? A: 28.")
    probe_gap = torch.tensor(megatron.probe_logprobs(probe)) - torch.tensor(reference.probe_logprobs(probe))
    exported = megatron.export(out / "export")
    export_max_diff = max(
        (exported[name].float() - tensor.float()).abs().max().item() for name, tensor in loaded.items()
    )

    samples = _samples()
    rows = [rl_batch.build_batch(part, pad_id=256) for part in rl_batch.micro_batches(samples, 4)]
    megatron_steps = [megatron.train_step(rows, config.grpo) for _ in range(2)]
    reference_steps = [reference.train_step(rows, config.grpo) for _ in range(2)]
    megatron_stats, reference_stats = megatron_steps[0], reference_steps[0]
    bf16_stats = _bf16_policy(config).train_step(rows, config.grpo)

    # Resume from step 2: the trained weights come back, the KL reference stays the starting checkpoint.
    megatron.save(out / "ckpt", 2)
    trained = {name: param.detach().float().cpu() for name, param in megatron.trainer.model.module.named_parameters()}
    initial = {name: tensor.float() for name, tensor in megatron.reference.items()}
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    resumed = MegatronPolicy(config, run_dir / "engine.yaml", CommGuardPolicy.from_engine(config.comm, run_dir))
    resumed_params = {
        name: param.detach().float().cpu() for name, param in resumed.trainer.model.module.named_parameters()
    }
    # Which parameters did not come back bit-identical: [max |difference|, max |value|] each.
    inexact = {
        name: [(resumed_params[name] - t).abs().max().item(), t.abs().max().item()]
        for name, t in trained.items()
        if not torch.equal(resumed_params[name], t)
    }
    print(
        json.dumps(
            {
                "builder": builder,
                "probe_mean_abs_diff": probe_gap.abs().mean().item(),
                "exported_names_match": sorted(exported) == sorted(loaded),
                "export_max_abs_diff": export_max_diff,
                "loss": [megatron_stats["loss"], reference_stats["loss"]],
                # Step 1: [Megatron (bf16), transformers fp32, transformers bf16].
                "grad_norm": [megatron_stats["grad_norm"], reference_stats["grad_norm"], bf16_stats["grad_norm"]],
                "tokens": [megatron_stats["tokens"], reference_stats["tokens"]],
                "kl_step1": [megatron_steps[0]["kl"], reference_steps[0]["kl"]],
                "kl_step2": [megatron_steps[1]["kl"], reference_steps[1]["kl"]],
                "loss_step2": [megatron_steps[1]["loss"], reference_steps[1]["loss"]],
                "resumed_step": resumed.step,
                "resumed_weights_max_abs_diff": max(
                    (resumed_params[n] - t).abs().max().item() for n, t in trained.items()
                ),
                "resumed_inexact": inexact,
                "resumed_reference_max_abs_diff": max(
                    (resumed.reference[n].float() - t).abs().max().item() for n, t in initial.items()
                ),
                "trained_moved_from_reference": max((trained[n] - t).abs().max().item() for n, t in initial.items()),
            }
        )
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
