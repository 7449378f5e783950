"""Weight-sync seconds, disk vs CUDA IPC vs broadcast, by weight size; and the rollout's generation speed vs
plain vLLM.

    PYTHONPATH=/opt/site-vllm:. python benchmarks/rl_weight_sync.py --out rl_weight_sync.json [--layers 2,8]
        [--broadcast]

Runs in the rollout's environment (vLLM on a GPU). For each size, a random Qwen3-Next checkpoint with the
35B-A3B's hidden size (2048), vocabulary (248,320) and experts (256 x 512) and `--layers` layers is built on the
GPU; one vLLM engine (sleep mode on, as gdnctl colocates it) serves it, and the same weights are synced into it
both ways, with the functions gdnctl's rollout runs:

- disk: weight_sync.write_weights (bf16 safetensors to a directory, swapped in whole), then vLLM's
  reload_weights from the directory: the trainer's export plus the rollout's reload;
- cuda_ipc: cuda_ipc.buckets over the GPU tensors, each bucket's handle opened and loaded by the vLLM worker
  (begin_reload / load_bucket / end_reload through collective_rpc), as the rl job does;
- broadcast (--broadcast, needs 2 GPUs): a second process on GPU 1 holds the same weights and broadcasts them
  bucket by bucket over NCCL (broadcast.TrainerEnd) to the vLLM worker on GPU 0 (broadcast.receive_bucket), as
  trainer rank 0 does for a rollout on GPUs of its own.

The bench process stands in for the trainer (its tensors live here; vLLM's worker is another process, so the
IPC handles cross a process boundary as in a run). After each sync the engine scores a probe, which must give
the same log-probs both ways. Then, on the smallest size, rollout tokens/s: gdnctl's VllmRollout.generate (token
ids in, samples with log-probs out) vs plain LLM.generate on the same engine, prompts and sampling settings.
Results go to --out after every measurement.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with gdnctl's functions

import torch  # noqa: E402

from gdnctl.runtime.rl import worker_reload  # noqa: E402
from gdnctl.runtime.rl.weights import broadcast, buckets, cuda_ipc
from gdnctl.runtime.rl.weights import sync as weight_sync

HIDDEN, VOCAB, EXPERTS, EXPERT_FFN = 2048, 248320, 256, 512


def proxy_config(layers: int) -> dict:
    """Qwen3-Next with the 35B-A3B's width, vocabulary and experts; every fourth layer full attention."""
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": HIDDEN,
        "vocab_size": VOCAB,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": EXPERTS,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": EXPERT_FFN,
        "shared_expert_intermediate_size": EXPERT_FFN,
        "intermediate_size": 512,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "full_attention_interval": 4,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        "torch_dtype": "bfloat16",
    }


def random_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Every HF tensor of the config's model (names and shapes from transformers' class on the meta device),
    random bf16 on the GPU, norms at 1 (the A_log / dt_bias as transformers initialises them)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    with torch.device("meta"):
        model = Qwen3NextForCausalLM(Qwen3NextConfig(**config))
    generator = torch.Generator(device="cuda").manual_seed(seed)
    tensors = {}
    for name, meta in model.state_dict().items():
        tensor = torch.empty(meta.shape, dtype=torch.bfloat16, device="cuda")
        if name.endswith("norm.weight"):
            tensor.zero_()
        elif name.endswith(("A_log", "dt_bias")):
            tensor.uniform_(generator=generator)
        else:
            tensor.normal_(std=0.02, generator=generator)
        tensors[name] = tensor
    torch.cuda.empty_cache()  # vLLM checks at start-up that its share of the GPU is free
    return tensors


def sync_disk(llm, tensors: dict[str, torch.Tensor], directory: Path, config: dict) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    weight_sync.write_weights(tensors.items(), directory, config=config)
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(directory)})
    return time.perf_counter() - began


def sync_ipc(llm, tensors: dict[str, torch.Tensor]) -> tuple[float, int]:
    torch.cuda.synchronize()
    began = time.perf_counter()
    llm.collective_rpc(worker_reload.begin_reload)
    count = 0
    for bucket in cuda_ipc.buckets(tensors.items()):
        shared = {cuda_ipc.device_uuid(): cuda_ipc.share(bucket.buffer)}
        llm.collective_rpc(cuda_ipc.load_bucket, args=(shared, bucket.wire_entries()))
        count += 1
        del bucket
    llm.collective_rpc(worker_reload.end_reload)
    return time.perf_counter() - began, count


def broadcast_root(connection, layers: int) -> None:
    """The stand-in for trainer rank 0 on GPU 1: the same seeded weights, a weight group with the vLLM worker,
    then one broadcast of every bucket per "sync" it is sent."""
    torch.cuda.set_device(1)
    tensors = random_weights(proxy_config(layers), seed=layers)
    plan = [(bucket.buffer.numel(), bucket.wire_entries()) for bucket in buckets.buckets(tensors.items())]
    end = broadcast.TrainerEnd(True, workers=1, device=torch.device("cuda", 1), timeout_s=600)
    connection.send((end.join_fields(), plan))
    end.join(check=lambda: None)
    while connection.recv() == "sync":
        for bucket in buckets.buckets(tensors.items()):
            end.send(bucket, check=lambda: None)
        connection.send("sent")


def sync_broadcast(llm, connection, plan: list) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    connection.send("sync")
    llm.collective_rpc(worker_reload.begin_reload)
    for nbytes, entries in plan:
        llm.collective_rpc(broadcast.receive_bucket, args=(nbytes, entries))
    llm.collective_rpc(worker_reload.end_reload)
    seconds = time.perf_counter() - began
    connection.recv()
    return seconds


def probe_logprobs(llm, tokens: list[int]) -> list[float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm.reset_prefix_cache()
    scored = llm.generate(
        [TokensPrompt(prompt_token_ids=tokens)],
        SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
        use_tqdm=False,
    )[0]
    return [entry[token].logprob for entry, token in zip(scored.prompt_logprobs[1:], tokens[1:], strict=True)]


def generation_speed(llm, prompts: int, tokens: int, repeats: int) -> dict:
    """Tokens/s of plain LLM.generate and of gdnctl's VllmRollout.generate, alternated, same settings."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from gdnctl.runtime.rl.rollout.server import VllmRollout

    rollout = VllmRollout(SimpleNamespace(device="cuda"))
    rollout.llm = llm
    ids = [[(7 * p + 3 * i) % 1000 + 10 for i in range(32)] for p in range(prompts)]
    plain_rates, gdnctl_rates = [], []
    for repeat in range(repeats):
        params = [
            SamplingParams(
                n=1, max_tokens=tokens, temperature=1.0, logprobs=0, detokenize=False, seed=repeat * prompts + index
            )
            for index in range(prompts)
        ]
        began = time.perf_counter()
        outputs = llm.generate([TokensPrompt(prompt_token_ids=x) for x in ids], params, use_tqdm=False)
        plain_rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - began))
        began = time.perf_counter()
        reply = rollout.generate(ids, n=1, max_tokens=tokens, temperature=1.0, seed=repeat * prompts, stop_token_ids=[])
        gdnctl_rates.append(sum(len(s[0]["tokens"]) for s in reply["samples"]) / (time.perf_counter() - began))
    plain, ours = statistics.median(plain_rates[1:]), statistics.median(gdnctl_rates[1:])
    return {
        "prompts": prompts,
        "tokens_per_prompt": tokens,
        "repeats": repeats,
        "plain_vllm_tokens_per_s": plain_rates,
        "gdnctl_tokens_per_s": gdnctl_rates,
        "median_plain": plain,
        "median_gdnctl": ours,
        "gdnctl_over_plain": ours / plain,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", default="2,8", help="sizes to measure, as layer counts")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gdnctl-sync-bench"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--broadcast", action="store_true", help="also the NCCL broadcast from GPU 1 (2 GPUs)")
    args = parser.parse_args()
    from vllm import LLM

    result = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "versions": {name: importlib.metadata.version(name) for name in ("vllm", "torch")},
        "command": " ".join(sys.argv),
        "sizes": [],
    }
    for index, layers in enumerate(int(x) for x in args.layers.split(",")):
        config = proxy_config(layers)
        model_dir = args.work / f"proxy-{layers}"
        shutil.rmtree(args.work, ignore_errors=True)
        tensors = random_weights(config, seed=layers)
        weight_sync.write_weights(tensors.items(), model_dir, config=config)
        gib = sum(t.numel() * t.element_size() for t in tensors.values()) / 2**30
        began = time.perf_counter()
        llm = LLM(
            model=str(model_dir),
            skip_tokenizer_init=True,
            dtype="bfloat16",
            enforce_eager=True,
            gpu_memory_utilization=0.5,
            max_model_len=1024,
            enable_sleep_mode=True,
            gdn_prefill_backend="triton",
        )
        size = {
            "layers": layers,
            "weights_gib": gib,
            "engine_start_s": time.perf_counter() - began,
            "disk_s": [],
            "cuda_ipc_s": [],
            "broadcast_s": [],
        }
        root = connection = None
        if args.broadcast:
            import multiprocessing

            context = multiprocessing.get_context("spawn")
            connection, theirs = context.Pipe()
            root = context.Process(target=broadcast_root, args=(theirs, layers), daemon=True)
            root.start()
            fields, plan = connection.recv()
            # One engine: its worker is the group's rank 1, after the broadcasting root.
            llm.collective_rpc(
                broadcast.join_group,
                args=(fields["host"], fields["port"], fields["size"], fields["backend"], fields["timeout_s"], 1),
            )
        probe = list(range(100, 164))
        reference = probe_logprobs(llm, probe)
        for _ in range(args.repeats):
            size["disk_s"].append(sync_disk(llm, tensors, args.work / "sync", config))
            after_disk = probe_logprobs(llm, probe)
            seconds, size["buckets"] = sync_ipc(llm, tensors)
            size["cuda_ipc_s"].append(seconds)
            after_ipc = probe_logprobs(llm, probe)
            if root is not None:
                size["broadcast_s"].append(sync_broadcast(llm, connection, plan))
                after_broadcast = probe_logprobs(llm, probe)
                size["probe_gap_broadcast_vs_disk"] = max(
                    abs(a - b) for a, b in zip(after_broadcast, after_disk, strict=True)
                )
        size["probe_gap_disk_vs_start"] = max(abs(a - b) for a, b in zip(after_disk, reference, strict=True))
        size["probe_gap_ipc_vs_disk"] = max(abs(a - b) for a, b in zip(after_ipc, after_disk, strict=True))
        size["speedup"] = statistics.median(size["disk_s"]) / statistics.median(size["cuda_ipc_s"])
        if root is not None:
            size["broadcast_speedup"] = statistics.median(size["disk_s"]) / statistics.median(size["broadcast_s"])
            connection.send("stop")
            root.join(60)
        if index == 0:
            size["generation"] = generation_speed(llm, prompts=256, tokens=128, repeats=4)
        result["sizes"].append(size)
        args.out.write_text(json.dumps(result, indent=1))
        print(json.dumps(size), flush=True)
        del llm, tensors
        import gc

        gc.collect()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
