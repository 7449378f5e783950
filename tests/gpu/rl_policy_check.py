"""Run by test_rl_policy_gpu.py in its own process (Megatron's parallel state is process-global).

The rl job's GPU policy (MegatronPolicy: TE-free Megatron-Core model, bf16) against its CPU policy's code
(TorchPolicy: transformers' Qwen3.5 class, fp32, here on the same GPU), both loaded from one random HF
checkpoint of the byte-level tiny Qwen3.5: the probe log-probs, the exported HF tensors, and one GRPO step's
loss and grad norm on the same rows. Prints one JSON line with the measured differences.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

# Run as a script: the repository root (for tests.rl) is not on sys.path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _samples():
    from gdnctl.runtime.rl_batch import Sample

    generator = torch.Generator().manual_seed(0)
    samples = []
    for index in range(8):
        prompt = torch.randint(0, 256, (6 + index % 3,), generator=generator).tolist()
        response = torch.randint(0, 256, (5 + index % 4,), generator=generator).tolist()
        samples.append(Sample(index // 4, tuple(prompt), tuple(response), tuple(-5.5 for _ in response), "stop",
                              0.0, [1.0, -1.0, 0.5, -0.5][index % 4]))
    return samples


def main(out_dir: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1)
    from gdnctl.engine_config import EngineConfig
    from gdnctl.render import render
    from gdnctl.runtime import rl_batch
    from gdnctl.runtime.comm_guard import CommGuardPolicy
    from gdnctl.runtime.megatron_policy import MegatronPolicy
    from gdnctl.runtime.torch_policy import TorchPolicy
    from tests.rl.tiny_model import random_checkpoint

    out = Path(out_dir)
    loaded = random_checkpoint(out / "weights", seed=7, init_std=0.2)
    run_dir = out / "run"
    render("tiny-qwen3.5-rl-cpu", run_dir, ["cluster.gpu=h100", f"model.path={out / 'weights'}",
                                            "kernels.gdn_backend=fla", "comm.memory_guard=false"])
    config = EngineConfig.from_file(run_dir / "engine.yaml")
    megatron = MegatronPolicy(config, run_dir / "engine.yaml", CommGuardPolicy.from_engine(config.comm, run_dir))
    reference = TorchPolicy(config, device="cuda")

    probe = list(b"Q: 24 + 48 = ? A: 72. Q: 26 + 2 = ? A: 28.")
    probe_gap = (torch.tensor(megatron.probe_logprobs(probe)) - torch.tensor(reference.probe_logprobs(probe)))
    exported = megatron.export(out / "export")
    export_max_diff = max((exported[name].float() - tensor.float()).abs().max().item()
                          for name, tensor in loaded.items())

    samples = _samples()
    rows = [rl_batch.build_batch(part, pad_id=256) for part in rl_batch.micro_batches(samples, 4)]
    megatron_stats = megatron.train_step(rows, config.grpo)
    reference_stats = reference.train_step(rows, config.grpo)
    print(json.dumps({
        "probe_mean_abs_diff": probe_gap.abs().mean().item(),
        "exported_names_match": sorted(exported) == sorted(loaded),
        "export_max_abs_diff": export_max_diff,
        "loss": [megatron_stats["loss"], reference_stats["loss"]],
        "grad_norm": [megatron_stats["grad_norm"], reference_stats["grad_norm"]],
        "tokens": [megatron_stats["tokens"], reference_stats["tokens"]],
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
