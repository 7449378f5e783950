"""LoRA sft through megatron-bridge's PEFT (runtime/model/lora_wrap.py, lora_checkpoint.py), on the tiny Qwen3.5 dense
and MoE models with random weights made here, the MoE model once with an adapter per routed expert and once with
one shared by them (train.lora.expert_adapters; tests/gpu/lora_check.py builds the base, then runs gdnctl's Trainer
in its own process):

- the loss falls over a few steps;
- only the adapters change: every base parameter is bit for bit what it was after set-up, and every trainable
  parameter is an adapter;
- a checkpoint holds the adapters alone (the `peft` layout and each rank's tensors), the last one also the merged
  model as a full HF checkpoint;
- the saved adapter loads with `peft` onto transformers' model of the base and gives the merged export's logits;
- the merged export is base + (alpha / rank)·B·A, tensor by tensor, the routed experts' per expert, and the saved
  expert adapters are alike for every expert exactly where they are shared;
- a run resumed from the middle checkpoint starts with exactly the adapters and optimizer state it holds, and
  continues the uninterrupted run's loss curve;
- vLLM serving the merged export scores fixed token rows as the trained model (base + adapters) does, to bf16
  rounding (with GDNCTL_TEST_VLLM_PYTHON, as in test_rl_vllm_gpu.py).

Needs a CUDA GPU with Transformer Engine, megatron-bridge, megatron-core and FLA (the staged `gdn` and `te`
profiles), and peft and transformers for the adapter checks. GDNCTL_GPU_LOG_DIR, when set, receives the curves.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.gpu.lora_check import ALPHA, RANK, data_file
from tests.gpu.test_trainer_gpu import HERE, _record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is None, reason="needs Transformer Engine"),
    pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is None, reason="needs megatron-bridge"),
    # One worker builds the module's runs (a source model and two trainings per model) and every test reads them.
    pytest.mark.xdist_group("lora-sft"),
]
# (model, train.lora.expert_adapters): the dense model, and the MoE model with one adapter per expert and shared.
MODELS = [
    ("gdnctl/tiny-qwen3.5-bytes", "per_expert"),
    ("gdnctl/tiny-qwen3.5-moe-bytes", "per_expert"),
    ("gdnctl/tiny-qwen3.5-moe-bytes", "shared"),
]
STEPS, INTERVAL = 8, 4
NEEDS_PEFT = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None or importlib.util.find_spec("transformers") is None,
    reason="needs peft and transformers",
)
PEFT_PREFIX = "base_model.model."
VLLM_PYTHON = os.environ.get("GDNCTL_TEST_VLLM_PYTHON")
NEEDS_VLLM = pytest.mark.skipif(not VLLM_PYTHON, reason="GDNCTL_TEST_VLLM_PYTHON is not set (no GPU vLLM environment)")


def _check(*args: object, timeout: float = 1500) -> dict:
    proc = subprocess.run(
        [sys.executable, str(HERE / "lora_check.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _tag(model: str, expert_adapters: str) -> str:
    """The model's name, and whether its expert adapters are shared: the name of a case's directory and logs."""
    return model.split("/")[-1] + ("-shared" if expert_adapters == "shared" else "")


@dataclass(frozen=True)
class Runs:
    out: Path
    model: str
    expert_adapters: str
    whole: dict  # 8 steps, checkpoints at 4 and 8
    resumed: dict  # the step-4 checkpoint alone, resumed to 8

    @property
    def tag(self) -> str:
        return _tag(self.model, self.expert_adapters)

    @property
    def source(self) -> Path:
        return self.out / "source"

    def checkpoint(self, step: int, save_dir: str = "whole-ckpt") -> Path:
        return self.out / save_dir / f"iter_{step:07d}"


@pytest.fixture(scope="module", params=MODELS, ids=["dense", "moe", "moe-shared"])
def runs(request, tmp_path_factory) -> Runs:
    model, expert_adapters = request.param
    tag = _tag(model, expert_adapters)
    out = tmp_path_factory.mktemp(tag)
    data_file(out / "progressions.jsonl")
    _check("source", out, model)
    whole = _check("train", out, model, out / "whole-ckpt", STEPS, INTERVAL, expert_adapters)
    partial = out / "partial-ckpt"
    shutil.copytree(out / "whole-ckpt" / f"iter_{INTERVAL:07d}", partial / f"iter_{INTERVAL:07d}")
    (partial / "latest").write_text(f"iter_{INTERVAL:07d}\n")
    resumed = _check("train", out, model, partial, STEPS, INTERVAL, expert_adapters)
    _record(f"lora_{tag}", {"whole": whole, "resumed": resumed})
    return Runs(out, model, expert_adapters, whole, resumed)


def test_the_loss_falls(runs):
    losses = runs.whole["losses"]
    assert runs.whole["iterations"] == list(range(1, STEPS + 1))
    assert losses[-1] < losses[0] - 0.05, losses


def test_only_the_adapters_train(runs):
    for run in (runs.whole, runs.resumed):
        assert run["adapter_tensors"] > 0 and run["frozen_tensors"] > run["adapter_tensors"]
        assert run["every_trainable_is_an_adapter"], run["adapter_names_sample"]
        assert run["frozen_changed"] == []
        assert run["adapters_unchanged"] == []


def test_a_checkpoint_holds_the_adapters_and_the_last_the_merged_model(runs):
    middle, last = runs.checkpoint(INTERVAL), runs.checkpoint(STEPS)
    for directory in (middle, last):
        for name in (
            "adapter/adapter_config.json",
            "adapter/adapter_model.safetensors",
            "adapter/rank-00000.safetensors",
            "optimizer/rank-00000.pt",
            "trainer_state.json",
        ):
            assert (directory / name).is_file(), (directory, name)
        state = json.loads((directory / "trainer_state.json").read_text())
        assert {"adapter/adapter_model.safetensors", "adapter/rank-00000.safetensors"} <= set(state["files"])
        assert state["lora"]["rank"] == RANK and state["lora"]["alpha"] == ALPHA
        assert state["lora"]["expert_adapters"] == runs.expert_adapters
        assert Path(state["lora"]["base"]).resolve() == runs.source.resolve()
        assert len(state["lora"]["base_fingerprints"]) == 1
    assert not (middle / "model.safetensors.index.json").exists()  # the base is model.path's, not repeated
    assert (last / "model.safetensors.index.json").is_file() and (last / "config.json").is_file()
    config = json.loads((last / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == RANK and config["lora_alpha"] == ALPHA and config["peft_type"] == "LORA"
    if "moe" in runs.model:
        assert config["target_parameters"] == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]


def _hf_model(directory: Path, device: str = "cpu"):
    """The HF model in fp32. Its forward must run on the GPU: with FLA installed, transformers' Qwen3.5 calls FLA's
    Triton kernels (the GDN l2norm), which refuse CPU tensors."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to(device).eval()


@NEEDS_PEFT
def test_the_saved_adapter_loads_with_peft_and_gives_the_merged_models_logits(runs):
    import peft

    last = runs.checkpoint(STEPS)
    base = _hf_model(runs.source, "cuda")
    tokens = torch.randint(20, 220, (2, 64), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        base_logits = base(tokens).logits
        adapted = peft.PeftModel.from_pretrained(base, last / "adapter").eval()
        adapted_logits = adapted(tokens).logits
        merged_logits = _hf_model(last, "cuda")(tokens).logits
    moved = (adapted_logits - base_logits).norm()
    gap = (adapted_logits - merged_logits).norm()
    _record(f"lora_peft_{runs.tag}", {"adapter_moved_logits": moved.item(), "peft_vs_merged": gap.item()})
    assert moved > 0  # the trained adapter changes the model
    # The merged export is bf16 (and its GDN norms pass the bridge's w - 1 mapping: hf_roundtrip_check.py);
    # peft adds the adapter to fp32 base weights: they differ by roundings, far less than the adapter moves them.
    assert gap < 0.1 * moved, (gap, moved)
    assert (adapted_logits.argmax(-1) == merged_logits.argmax(-1)).float().mean() > 0.98


def _peft_adapters(directory: Path, source: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """HF weight name -> (A, B) of every adapter of a `peft` adapter directory: a module's weight X.weight from
    X.lora_A / X.lora_B; a routed experts' 3-D parameter from the ParamWrapper layout gdnctl writes
    (runtime/model/lora_adapters.py peft_tensors: A (experts x rank) x in, B out x (rank x experts), the parameters
    of one module nested through base_layer in sorted order), as A experts x rank x in and B experts x out x rank."""
    from safetensors.torch import load_file

    tensors = {
        name.removeprefix(PEFT_PREFIX): tensor.float()
        for name, tensor in load_file(str(directory / "adapter_model.safetensors")).items()
    }
    config = json.loads((directory / "adapter_config.json").read_text())
    parameters = sorted(name.rsplit(".", 1)[-1] for name in config.get("target_parameters", []))
    out = {}
    for name, a in tensors.items():
        if not name.endswith(".lora_A.weight"):
            continue
        module = name.removesuffix(".lora_A.weight")
        b = tensors[f"{module}.lora_B.weight"]
        parent, _, _ = module.partition(".base_layer")
        if not parent.endswith(".experts"):
            out[f"{module}.weight"] = (a, b)
            continue
        weight = f"{parent}.{parameters[module.count('.base_layer')]}"
        experts = source[weight].shape[0]
        rank = a.shape[0] // experts
        out[weight] = (a.reshape(experts, rank, -1), b.reshape(b.shape[0], rank, experts).permute(2, 0, 1))
    return out


@NEEDS_PEFT
def test_the_merged_export_is_base_plus_alpha_over_rank_b_a(runs):
    """Tensor by tensor: every adapted weight of the last checkpoint's merged model is the base's plus
    (alpha / rank)·B·A of the saved adapter (per expert for the routed experts), and every other tensor is the
    base's."""
    last = runs.checkpoint(STEPS)
    source = _hf_model(runs.source).state_dict()
    merged = _hf_model(last).state_dict()
    adapters = _peft_adapters(last / "adapter", source)
    assert adapters, "the checkpoint holds no adapter"
    report = {}
    for name in sorted(source):
        got, base = merged[name], source[name]
        if name in adapters:
            a, b = adapters[name]
            want = base + (ALPHA / RANK) * (b @ a)
            error, delta = (got - want).norm().item(), (want - base).norm().item()
            report[name] = error / delta
            assert delta > 0, name  # the trained adapter moves the weight
            # The merged export is bf16: a rounding of the sum, far below what the adapter adds.
            assert error < 0.1 * delta, (name, error, delta)
        elif "norm" in name:
            # The bridge maps zero-centred norms as w - 1 and back: a bf16 rounding at 1 (2^-7) at most.
            assert (got - base).abs().max() <= 2**-7 * max(1.0, base.abs().max().item()), name
        else:
            assert torch.equal(got, base), name
    _record(f"lora_merge_{runs.tag}", {"relative_error_per_adapted_tensor": report})
    if "moe" in runs.model:
        routed = [name for name in adapters if ".experts." in name]
        assert routed
        for name in routed:
            a, b = adapters[name]
            alike = all(torch.equal(a[e], a[0]) and torch.equal(b[e], b[0]) for e in range(1, a.shape[0]))
            # shared: one adapter for every expert, saved once per expert; per_expert: each trained its own.
            assert alike == (runs.expert_adapters == "shared"), name


def test_a_resume_starts_from_the_checkpoints_adapters_and_optimizer_state(runs):
    resumed = runs.resumed
    assert Path(resumed["resumed_from"]).resolve() == runs.checkpoint(INTERVAL, "partial-ckpt").resolve()
    assert resumed["start_iteration"] == INTERVAL
    assert resumed["adapters_differing_from_checkpoint"] == []
    assert resumed["optimizer_leaves"] > 0 and resumed["optimizer_leaves_differing_from_checkpoint"] == []
    assert resumed["iterations"] == list(range(INTERVAL + 1, STEPS + 1))
    expected = runs.whole["losses"][INTERVAL:]
    assert all(abs(a - b) / b < 0.01 for a, b in zip(resumed["losses"], expected, strict=True)), (
        expected,
        resumed["losses"],
    )
    whole = json.loads((runs.checkpoint(STEPS) / "trainer_state.json").read_text())["lora"]
    again = json.loads((runs.checkpoint(STEPS, "partial-ckpt") / "trainer_state.json").read_text())["lora"]
    assert again["base_fingerprints"] == whole["base_fingerprints"]  # the same base, loaded again from model.path


@NEEDS_VLLM
def test_vllm_serving_the_merged_export_gives_the_trained_models_log_probs(runs, tmp_path):
    """The last checkpoint's merged model, written as the rollout's weight sync writes weights for the vLLM that
    serves them (Qwen3.5's vision-language class before vLLM 0.27: checkpoint.rollout_source), served by vLLM:
    each probe token's log-prob is the trained model's (base + adapters, in the trainer's process), to bf16
    rounding: the policy that trains is the one that generates."""
    from gdnctl.knowledge import versions
    from gdnctl.knowledge.catalog import from_catalog
    from gdnctl.knowledge.model_families import QWEN3_5
    from gdnctl.runtime.model.checkpoint import HFReader, rollout_source, save_tensors
    from tests.gpu.vllm_logprobs_check import RESULT_PREFIX

    probe = runs.whole["probe"]
    version = subprocess.run(
        [VLLM_PYTHON, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    vision_language = versions.below(version, QWEN3_5.vllm_text_class_since)
    merged, served = HFReader(runs.checkpoint(STEPS)), tmp_path / "served"
    tensors = ((name, merged.get(name)) for name in merged.locations)
    save_tensors(tensors, served, rollout_source(from_catalog(runs.model), vision_language))
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps(probe["tokens"]))
    done = subprocess.run(
        [VLLM_PYTHON, str(HERE / "vllm_logprobs_check.py"), str(served), str(rows)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    line = next((line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)), None)
    assert line is not None, done.stdout[-4000:]
    result = json.loads(line[len(RESULT_PREFIX) :])
    gap = (torch.tensor(result["log_probs"]) - torch.tensor(probe["log_probs"])).abs()
    _record(
        f"lora_vllm_{runs.tag}",
        {
            "vllm": version,
            "architectures": result["architectures"],
            "mean_abs": gap.mean().item(),
            "max_abs": gap.max().item(),
        },
    )
    # The rl jobs' probe bound for a LoRA policy (tests/gpu/test_rl_lora_gpu.py): bf16 weights on both sides, two
    # kernel stacks.
    assert gap.mean() < 0.05, (gap.mean().item(), gap.max().item())
