"""Run by tests/gpu/test_rl_lora_gpu.py in its own process (Megatron's parallel state is process-global):

    python tests/gpu/rl_lora_check.py OUT_DIR

The rl job's GPU policy with train.lora (MegatronPolicy on the megatron-bridge builder: megatron-bridge's LoRA on a
frozen base), the byte-level tiny Qwen3.5 from one random HF checkpoint, the KL term on; no vLLM. It measures what
every weight sync sends and what the KL reference is:

- before any step, the export (what the disk transport writes) against the base checkpoint, tensor by tensor;
- after two GRPO steps: the export, `hf_tensors` (what the CUDA IPC and broadcast transports send) and a second
  export, against each other; each adapted weight of the export against base + (alpha / rank)·B·A of the adapters
  the policy holds, every other weight against the base; the frozen base parameters against themselves before the
  steps and exports;
- the probe's log-probs with the adapters switched off (the KL reference) against the probe before any step, and
  the trained policy's against it; the KL of steps 1 and 2;
- a policy resumed from the step-2 checkpoint: its adapters, its step and its reference; that checkpoint's merged
  model against the export.

Prints one JSON line with what it measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

KL_COEF = 0.05
RANK, ALPHA = 8, 16.0
LR = 1e-3  # large enough that two steps move the adapters well past bf16 rounding
STEPS = 2
PROBE = list(b"Q: 24 + 48 = ? A: 72. Q: 26 + 2 = ? A: 28.")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.process_group import init_check_process_group  # noqa: E402


def _policy(config, run_dir: Path):
    from gdnctl.runtime.comm.guard import CommGuardPolicy
    from gdnctl.runtime.rl.policy.megatron_policy import MegatronPolicy

    return MegatronPolicy(config, run_dir / "engine.yaml", CommGuardPolicy.from_engine(config.comm, run_dir))


def _adapters(policy) -> dict:
    """The policy's adapters by the HF weight each adapts (what the peft checkpoint holds)."""
    from gdnctl.runtime.model import lora_checkpoint

    trainer = policy.trainer
    return lora_checkpoint.adapters_from_hf(
        (name, tensor.detach().to("cpu", copy=True)) for name, tensor in trainer.builder.export_adapters(trainer.model)
    )


def _trainable(policy) -> dict[str, torch.Tensor]:
    return {
        name: param.detach().to("cpu", copy=True)
        for name, param in policy.trainer.model.module.named_parameters()
        if param.requires_grad
    }


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def main(out_dir: str) -> None:
    torch.cuda.set_device(0)
    init_check_process_group(Path(out_dir), "cpu:gloo,cuda:nccl")
    from megatron.core import parallel_state

    from gdnctl.launch.render import render
    from gdnctl.runtime.model.checkpoint import HFReader, checkpoint_name
    from gdnctl.runtime.model.lora_adapters import merge
    from gdnctl.runtime.rl.algorithm import batch as rl_batch
    from gdnctl.schema.engine import EngineConfig
    from tests.gpu.rl_policy_check import _samples
    from tests.runtime.rl.tiny_model import random_checkpoint

    out = Path(out_dir)
    base = random_checkpoint(out / "weights", seed=7, init_std=0.2)
    run_dir = out / "run"
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
            "runtime.transformer_engine=2.20.2",
            f"train.lora={{rank: {RANK}, alpha: {ALPHA}}}",
            f"train.lr={LR}",
            f"train.train_iters={STEPS}",
        ],
    )
    config = EngineConfig.from_file(run_dir / "engine.yaml")
    assert config.train.model_builder == "megatron-bridge" and config.train.lora is not None, config.train
    policy = _policy(config, run_dir)
    module = policy.trainer.model.module

    probe_start = policy.probe_logprobs(PROBE)
    export_start = policy.export(out / "export-start")
    frozen = {name: param.detach().clone() for name, param in module.named_parameters() if not param.requires_grad}

    rows = [rl_batch.build_batch(part, pad_id=256) for part in rl_batch.micro_batches(_samples(), 4)]
    steps = [policy.train_step(rows, config.grpo) for _ in range(STEPS)]

    adapters = _adapters(policy)
    exported = policy.export(out / "export-trained")
    shared = {name: tensor.detach().to("cpu", copy=True) for name, tensor in policy.hf_tensors()}
    again = policy.export(out / "export-again")
    merged_error, untouched = {}, {}
    for name, tensor in base.items():
        if name in adapters:
            want = merge(tensor, adapters[name], ALPHA)
            delta = (want.float() - tensor.float()).norm().item()
            merged_error[name] = [(exported[name].float() - want.float()).norm().item(), delta]
        else:
            untouched[name] = _max_diff(exported[name], tensor)
    probe_trained = policy.probe_logprobs(PROBE)
    with policy._reference_weights():
        probe_reference = policy.probe_logprobs(PROBE)

    policy.save(out / "ckpt", STEPS)
    trained = _trainable(policy)
    parallel_state.destroy_model_parallel()
    resumed = _policy(config, run_dir)
    resumed_trained = _trainable(resumed)
    with resumed._reference_weights():
        resumed_probe_reference = resumed.probe_logprobs(PROBE)
    last = HFReader(out / "ckpt" / checkpoint_name(STEPS))

    print(
        json.dumps(
            {
                "adapted": sorted(adapters),
                "start_export_max_abs_diff": max(
                    _max_diff(export_start[name], tensor) for name, tensor in base.items()
                ),
                "exported_names_match": sorted(exported) == sorted(base) == sorted(shared) == sorted(again),
                "shared_differs_from_export": sorted(
                    name for name in exported if not torch.equal(shared[name], exported[name])
                ),
                "second_export_differs": sorted(
                    name for name in exported if not torch.equal(again[name], exported[name])
                ),
                "frozen_changed": sorted(
                    name
                    for name, before in frozen.items()
                    if not torch.equal(dict(module.named_parameters())[name], before)
                ),
                # Per adapted weight: [|export - (base + alpha/rank B A)|, |alpha/rank B A|] (Frobenius norms).
                "merged_error": merged_error,
                "untouched_max_abs_diff": untouched,
                "kl": [step["kl"] for step in steps],
                "probe_reference_vs_start": max(abs(a - b) for a, b in zip(probe_reference, probe_start, strict=True)),
                "probe_trained_vs_start": max(abs(a - b) for a, b in zip(probe_trained, probe_start, strict=True)),
                "resumed_step": resumed.step,
                "resumed_adapters_differ": sorted(
                    name
                    for name, tensor in trained.items()
                    if not torch.equal(resumed_trained.get(name, torch.empty(0)), tensor)
                ),
                "resumed_adapter_names_match": sorted(resumed_trained) == sorted(trained),
                "resumed_probe_reference_vs_start": max(
                    abs(a - b) for a, b in zip(resumed_probe_reference, probe_start, strict=True)
                ),
                "checkpoint_differs_from_export": sorted(
                    name for name in exported if not torch.equal(last.get(name), exported[name])
                ),
            }
        )
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
