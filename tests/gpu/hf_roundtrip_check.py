"""Run by the GPU tests in its own process (Megatron's parallel state is process-global).

    python tests/gpu/hf_roundtrip_check.py OUT_DIR [MODEL_ID] [BUILDER]     (BUILDER: megatron-bridge | te-free)
    torchrun --standalone --nproc_per_node TP tests/gpu/hf_roundtrip_check.py OUT_DIR [MODEL_ID] [BUILDER]

Builds a tiny model (default gdnctl/tiny-qwen3.5) with random weights on one GPU through the named builder,
writes it as an HF checkpoint, then checks (1) transformers' class loaded from that checkpoint gives the same
logits, (2) a fresh Megatron model with other random weights, loaded from the checkpoint, gives bit-identical
logits, and (3) a backward pass through the loaded model gives finite gradients on every rank. Rank 0 prints one
JSON line with the measured errors.

Under torchrun the model is tensor-parallel over all the ranks, and the ranks share GPU 0 and talk through gloo:
NCCL refuses two ranks on one device, while gloo moves CUDA tensors for every collective tensor parallelism uses
here. That runs the TP layouts a larger machine would (TP above the KV heads included: every builder, loader and
exporter sees the real group sizes) on the one GPU a session may get. With GDNCTL_CHECK_GPU_PER_RANK=1 each rank
takes its own GPU (LOCAL_RANK) and the ranks talk NCCL, as a trainer on that many GPUs does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

# Run as a script: the repository root (for tests.gpu) is not on sys.path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.process_group import init_check_process_group  # noqa: E402


def _engine_config(run_dir: Path, model_id: str, builder: str, tp: int):
    from gdnctl.launch.render import render
    from gdnctl.schema.engine import EngineConfig

    te = "none" if builder == "te-free" else "2.20.2"
    # The backward pass below runs without Megatron's DDP wrapper, so no parameter has the main_grad buffer that
    # Transformer Engine's fused weight-gradient accumulation writes into: build without it.
    render(
        "tiny-qwen3.5-sft",
        run_dir,
        [
            "kernels.gdn_backend=fla",
            f"model.id={model_id}",
            "speed.wgrad_fusion=off",
            f"runtime.transformer_engine={te}",
            f"cluster.gpus_per_node={tp}",
            f"parallel.tp={tp}",
        ],
    )
    config = EngineConfig.from_file(run_dir / "engine.yaml")
    assert config.train.model_builder == builder, config.train.model_builder
    return config


def main(out_dir: str, model_id: str = "gdnctl/tiny-qwen3.5", builder_name: str = "te-free") -> None:
    # One rank per GPU talks NCCL; ranks sharing GPU 0 under torchrun talk gloo (the docstring says why).
    own_gpu = os.environ.get("GDNCTL_CHECK_GPU_PER_RANK") == "1" or int(os.environ.get("WORLD_SIZE", "1")) == 1
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) if own_gpu else 0)
    backend = "nccl" if own_gpu else "gloo"
    rank, tp = init_check_process_group(Path(out_dir), backend)
    from megatron.core import parallel_state, tensor_parallel

    from gdnctl.runtime.kernels.backends import install_kernel_on_layers, patch_megatron_gdn_kernel, resolve_backend
    from gdnctl.runtime.model import checkpoint, make_model_builder

    config = _engine_config(Path(out_dir) / f"run-{rank}", model_id, builder_name, tp)
    kernel = resolve_backend("fla")
    patch_megatron_gdn_kernel(kernel)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    builder = make_model_builder(config)

    def build(seed: int):
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        torch.manual_seed(seed)
        model = builder.build(pre_process=True, post_process=True).eval()
        install_kernel_on_layers(model, kernel)
        return model

    arch = config.model
    tokens = torch.randint(arch.vocab_size, (2, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    positions = torch.arange(256, device="cuda").expand(2, -1)

    def megatron_logits(model, grad: bool = False):
        with torch.set_grad_enabled(grad):
            # The output layer keeps the vocabulary split over TP; gather it (identity at TP 1).
            logits = tensor_parallel.gather_from_tensor_model_parallel_region(model(tokens, positions, None))
            return logits.float()[..., : arch.vocab_size]

    first = build(1)
    # Random weights everywhere, including the norms (zero-initialised weights would hide a wrong offset).
    with torch.no_grad():
        for name, param in first.named_parameters():
            if "norm" in name or name.endswith(("dt_bias", "A_log")):
                param.add_(torch.randn_like(param) * 0.1)
    directory = Path(out_dir) / "hf"
    builder.save(first, directory, checkpoint.text_only_source(arch))
    dist.barrier()  # rank 0 has written the checkpoint the other ranks load
    expected = megatron_logits(first)

    second = build(2)
    before = (megatron_logits(second) - expected).abs().max().item()
    builder.load(second, directory)
    reload_max_abs = (megatron_logits(second) - expected).abs().max().item()

    second.train()
    megatron_logits(second, grad=True).logsumexp(-1).mean().backward()
    grads = [p.grad for p in second.parameters() if p.requires_grad]
    finite = torch.tensor([float(all(g is not None and bool(torch.isfinite(g).all()) for g in grads))], device="cuda")
    dist.all_reduce(finite, op=dist.ReduceOp.MIN)

    if rank == 0:
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).cuda().eval()
        with torch.no_grad():
            hf_logits = hf_model(tokens).logits.float()
        relative = ((hf_logits - expected).norm() / expected.norm()).item()
        agree = (hf_logits.argmax(-1) == expected.argmax(-1)).float().mean().item()
        attention = next(m for m in first.modules() if type(m).__name__ == "SelfAttention")
        print(
            json.dumps(
                {
                    "reload_max_abs_diff": reload_max_abs,
                    "before_reload_max_abs_diff": before,
                    "transformers_relative_error": relative,
                    "transformers_argmax_agreement": agree,
                    "gradients_finite_on_every_rank": bool(finite.item()),
                    "tp": tp,
                    "backend": backend,
                    "kv_heads": arch.num_key_value_heads,
                    "kv_heads_per_rank": attention.num_query_groups_per_partition,
                    "core_attention": type(attention.core_attention).__name__,
                    "hf_class": type(hf_model).__name__,
                    "builder": builder.builder,
                    "layer_norm_kind": type(first.decoder.final_layernorm).__name__,
                }
            )
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
