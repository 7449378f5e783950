"""Run by tests/gpu/test_lora_gpu.py, one phase per process (Megatron's parallel state is process-global):

    python tests/gpu/lora_check.py source OUT_DIR MODEL_ID
    python tests/gpu/lora_check.py train OUT_DIR MODEL_ID SAVE_DIR STEPS SAVE_INTERVAL

`source`: builds the tiny model through the megatron-bridge builder with random weights (norms too) and saves it as
an HF checkpoint in OUT_DIR/source, the base the LoRA runs load from model.path (the bridge's own save, which its
loader reads back: tests/gpu/hf_roundtrip_check.py).

`train`: renders the tiny sft preset with train.lora on that base, builds gdnctl's Trainer in this process and
trains to STEPS, saving every SAVE_INTERVAL steps into SAVE_DIR (a resume when SAVE_DIR already holds a
checkpoint). Before training it records whether the model's adapters and optimizer state are exactly what the
resumed checkpoint holds; after, whether every frozen (base) parameter is bit for bit what it was after set-up and
whether the adapters moved. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.process_group import init_check_process_group  # noqa: E402

PRESET = "tiny-qwen3.5-sft"
TE_VERSION = "2.20.2"  # any version: it selects the megatron-bridge builder
RANK, ALPHA = 8, 16.0
LR = 1e-2  # adapters on a random base move the loss only slowly at a fine-tuning lr
SEQ_LENGTH = 256


def every_target(model_id: str) -> list[str]:
    """Every LoRA target the model has: megatron-bridge's default coverage plus the GDN layers' in and out
    projections, so the GDN adapters are trained, exported, merged and loaded by peft too."""
    from gdnctl.knowledge import lora
    from gdnctl.knowledge.catalog import from_catalog

    arch = from_catalog(model_id)
    return [name for name in lora.TARGETS if lora.has_target(arch, name)]


def _sets(model_id: str, source: Path | None, extra: list[str]) -> list[str]:
    base = [f"model.path={source}"] if source is not None else []
    return [
        "kernels.gdn_backend=fla",
        f"model.id={model_id}",
        *base,
        f"runtime.transformer_engine={TE_VERSION}",
        "comm.memory_guard=false",
        f"train.seq_length={SEQ_LENGTH}",
        *extra,
    ]


def _engine_config(run_dir: Path, sets: list[str]):
    from gdnctl.launch.render import render
    from gdnctl.schema.engine import EngineConfig

    render(PRESET, run_dir, sets, force=True)
    config = EngineConfig.from_file(run_dir / "engine.yaml")
    assert config.train.model_builder == "megatron-bridge", config.train.model_builder
    return config


def data_file(path: Path, documents: int = 256) -> Path:
    """Arithmetic progressions inside the byte vocabulary: each next token follows from the two before it."""
    import random

    rng = random.Random(0)
    with path.open("w") as handle:
        for _ in range(documents):
            start, stride, length = rng.randrange(200), rng.randrange(1, 7), rng.randrange(64, SEQ_LENGTH)
            handle.write(json.dumps({"input_ids": [20 + (start + i * stride) % 200 for i in range(length)]}) + "\n")
    return path


def source(out_dir: Path, model_id: str) -> None:
    from megatron.core import parallel_state, tensor_parallel

    from gdnctl.runtime.kernels.backends import patch_megatron_gdn_kernel, resolve_backend
    from gdnctl.runtime.model import checkpoint, make_model_builder

    config = _engine_config(out_dir / "source-run", _sets(model_id, None, []))
    patch_megatron_gdn_kernel(resolve_backend("fla"))
    parallel_state.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(7)
    torch.manual_seed(7)
    builder = make_model_builder(config)
    model = builder.build(pre_process=True, post_process=True)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(("dt_bias", "A_log")):
                param.add_(torch.randn_like(param) * 0.1)
    builder.save(model, out_dir / "source", checkpoint.text_only_source(config.model))
    print(json.dumps({"source": str(out_dir / "source")}))


def _flat(value, path: str = "") -> dict[str, torch.Tensor]:
    """Every tensor and number of an optimizer state, by its path."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{path}.{key}").items()}
    if isinstance(value, (list, tuple)):
        return {k: v for index, item in enumerate(value) for k, v in _flat(item, f"{path}[{index}]").items()}
    if isinstance(value, torch.Tensor):
        return {path: value.detach().to("cpu")}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {path: torch.tensor(float(value), dtype=torch.float64)}
    return {}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    names = sorted(set(a) | set(b))
    return [
        name
        for name in names
        if name not in a
        or name not in b
        or a[name].shape != b[name].shape
        or not torch.equal(a[name].to(b[name].dtype), b[name])
    ]


def train(
    out_dir: Path, model_id: str, save_dir: Path, steps: int, save_interval: int, expert_adapters: str = "per_expert"
) -> None:
    from safetensors.torch import load_file

    from gdnctl.runtime.model import checkpoint, lora_checkpoint
    from gdnctl.runtime.train.trainer import Trainer

    run_dir = out_dir / f"run-{save_dir.name}-{steps}"
    sets = _sets(
        model_id,
        out_dir / "source",
        [
            f"train.data_path={out_dir / 'progressions.jsonl'}",
            f"train.lr={LR}",
            f"train.train_iters={steps}",
            f"train.save_dir={save_dir}",
            f"train.save_interval={save_interval}",
            f"train.lora={{rank: {RANK}, alpha: {ALPHA}, targets: [{', '.join(every_target(model_id))}], "
            f"expert_adapters: {expert_adapters}}}",
        ],
    )
    config = _engine_config(run_dir, sets)
    trainer = Trainer(config, run_dir / "engine.yaml", policy=None)
    trainer.setup()
    module = trainer.model.module
    result: dict = {
        "resumed_from": str(trainer.resume_dir) if trainer.resume_dir else None,
        "start_iteration": trainer.iteration,
    }
    if trainer.resume_dir is not None:
        rank = dist.get_rank()
        stored = load_file(str(trainer.resume_dir / lora_checkpoint.shard_file(rank)))
        live = {name: p.detach().to("cpu") for name, p in lora_checkpoint.adapter_tensors(module).items()}
        result["adapters_differing_from_checkpoint"] = _same(live, stored)
        saved_optimizer = torch.load(
            trainer.resume_dir / checkpoint.optimizer_file(rank), map_location="cpu", weights_only=True
        )
        result["optimizer_leaves_differing_from_checkpoint"] = _same(
            _flat(checkpoint.optimizer_state(trainer.optimizer)), _flat(saved_optimizer)
        )
        result["optimizer_leaves"] = len(_flat(saved_optimizer))
    frozen = {name: p.detach().to("cpu", copy=True) for name, p in module.named_parameters() if not p.requires_grad}
    adapters = {name: p.detach().to("cpu", copy=True) for name, p in module.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(module.named_parameters())
    result.update(
        losses=[stats.loss for stats in trainer.step_stats],
        iterations=[stats.iteration for stats in trainer.step_stats],
        frozen_tensors=len(frozen),
        adapter_tensors=len(adapters),
        adapter_names_sample=sorted(adapters)[:4],
        frozen_changed=[name for name, before in frozen.items() if not torch.equal(after[name].detach().cpu(), before)],
        adapters_unchanged=[
            name for name, before in adapters.items() if torch.equal(after[name].detach().cpu(), before)
        ],
        every_trainable_is_an_adapter=all(".adapter." in name for name in adapters),
    )
    result["probe"] = trained_log_probs(module, config.model.vocab_size)
    trainer.close()
    if dist.get_rank() == 0:
        print(json.dumps(result))


def probe_tokens() -> torch.Tensor:
    """Two fixed rows of 64 byte tokens, the sequences whose log-probs the trainer and vLLM are compared on."""
    return torch.randint(20, 220, (2, 64), generator=torch.Generator().manual_seed(0))


def trained_log_probs(module, vocab_size: int) -> dict:
    """The trained model's (base + adapters, eval mode) log-prob of each probe token after the first, given the
    tokens before it: what vLLM serving the merged export should give (test_lora_gpu.py)."""
    tokens = probe_tokens().cuda()
    positions = torch.arange(tokens.shape[1], device="cuda").expand(tokens.shape[0], -1)
    module.eval()
    with torch.no_grad():
        logits = module(tokens, positions, None).float()[..., :vocab_size]
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    return {"tokens": tokens.tolist(), "log_probs": log_probs.tolist()}


def main(phase: str, out_dir: str, model_id: str, *rest: str) -> None:
    torch.cuda.set_device(0)
    # NCCL for CUDA tensors; gloo for the CPU ones the trainer's checks reduce (the runtime's own pair).
    backend = "cpu:gloo,cuda:nccl" if int(os.environ.get("WORLD_SIZE", "1")) == 1 else "gloo"
    # A store of its own per phase and save dir: a file store left by an earlier process must not be reused.
    init_check_process_group(Path(out_dir) / f"pg-{phase}-{Path(rest[0]).name if rest else 'source'}", backend)
    if phase == "source":
        source(Path(out_dir), model_id)
    else:
        save_dir, steps, save_interval, *expert_adapters = rest
        train(Path(out_dir), model_id, Path(save_dir), int(steps), int(save_interval), *expert_adapters)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
