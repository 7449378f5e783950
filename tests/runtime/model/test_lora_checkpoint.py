"""A LoRA run's checkpoint (runtime/model/lora_checkpoint.py) and what trains under megatron-bridge's LoRA
(runtime/model/lora_wrap.py), the parts that run without a GPU: megatron-bridge's exported adapter names into the
`peft` layout that `peft` loads, the per-rank adapter tensors a resume restores, the base's fingerprint, which
checkpoint a LoRA run may resume, and the check that only adapters train. tests/gpu/test_lora_gpu.py runs the
trainer itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gdnctl.knowledge import lora
from gdnctl.runtime.model import lora_checkpoint
from gdnctl.runtime.model.checkpoint_layout import CheckpointError
from gdnctl.runtime.model.lora_adapters import CONFIG_FILE, Adapter, merged_state
from gdnctl.runtime.model.lora_checkpoint import LORA_A, LORA_B
from gdnctl.runtime.model.lora_wrap import trainable
from gdnctl.runtime.model.megatron_config import ModelBuildError
from gdnctl.runtime.model.passthrough import HFSource
from gdnctl.schema import EngineLora
from tests.runtime.model.test_lora_adapters import ALPHA, TINY, TINY_MOE, _hf_model, _random_adapters

SPEC = EngineLora(
    rank=4,
    alpha=ALPHA,
    dropout=0.0,
    targets=["attention_qkv", "mlp"],
    target_modules=lora.megatron_target_modules(("attention_qkv", "mlp")),
)


def _as_bridge_exports(adapters: dict[str, Adapter]) -> list[tuple[str, torch.Tensor]]:
    """The adapters as megatron-bridge 0.6.2's export_adapter_weights yields them with a fused expert mapping (a
    bridge that read a checkpoint storing experts.gate_up_proj): `X.lora_A.weight` and `X.lora_B.weight` for a
    module's weight X.weight; for a routed experts' 3-D parameter P (no `.weight`), P.lora_A and P.lora_B stacked
    per expert (models/conversion/peft_bridge.py _make_lora_param_name and stream_adapter_weights_megatron_to_hf).
    gdnctl's bridge, built from a config, exports them per expert instead (the test below)."""
    pairs = []
    for name, adapter in adapters.items():
        base = name.removesuffix(".weight") if adapter.a.dim() == 2 else name
        pairs += [(f"{base}.lora_A.weight", adapter.a), (f"{base}.lora_B.weight", adapter.b)]
    return pairs


@pytest.mark.parametrize("arch", [TINY, TINY_MOE], ids=["dense", "moe"])
def test_the_exported_adapters_load_with_peft_and_give_the_merged_models_logits(arch, tmp_path):
    import peft

    torch.manual_seed(0)
    base = _hf_model(arch)
    state = base.state_dict()
    targets = lora.default_targets(arch)
    adapters = _random_adapters(arch, state, targets)
    found = lora_checkpoint.adapters_from_hf(_as_bridge_exports(adapters))
    assert set(found) == set(adapters)
    spec = SPEC.model_copy(update={"targets": list(targets)})
    written = lora_checkpoint.write_peft(tmp_path, found, spec, base="/models/base", durable=False)
    assert set(written) == {"adapter/adapter_config.json", "adapter/adapter_model.safetensors"}
    assert json.loads((tmp_path / "adapter" / CONFIG_FILE).read_text())["base_model_name_or_path"] == "/models/base"

    merged = _hf_model(arch)
    merged.load_state_dict(merged_state(state, adapters, ALPHA))
    adapted = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    tokens = torch.randint(0, arch.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(adapted(tokens).logits, merged(tokens).logits, atol=2e-5, rtol=1e-4)


def _per_expert_bridge_exports(arch, state: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """Random routed-expert adapters as megatron-bridge 0.6.2 exports them through a per-expert mapping (what
    gdnctl's config-built bridge has: models/conversion/utils.py moe_experts_stored_packed defaults to per-expert):
    Megatron's linear_fc1 adapter (one A, B over gate's rows then up's) as experts.N.gate_proj and up_proj with
    that A and the halves of B (peft_bridge.py _split_fused_fc1_linear_out_weight), linear_fc2's as down_proj; and
    one attention adapter, which passes through as it is."""
    rank, pairs = 4, []
    for name, tensor in state.items():
        if not name.endswith(".mlp.experts.gate_up_proj"):
            continue
        prefix = name.removesuffix(".gate_up_proj")
        experts, fused, hidden = tensor.shape
        inner = state[f"{prefix}.down_proj"].shape[2]
        for expert in range(experts):
            a, b = 0.1 * torch.randn(rank, hidden), 0.1 * torch.randn(fused, rank)
            one = f"{prefix}.{expert}"
            pairs += [
                (f"{one}.gate_proj{LORA_A}", a),
                (f"{one}.gate_proj{LORA_B}", b[: fused // 2]),
                (f"{one}.up_proj{LORA_A}", a.clone()),
                (f"{one}.up_proj{LORA_B}", b[fused // 2 :]),
                (f"{one}.down_proj{LORA_A}", 0.1 * torch.randn(rank, inner)),
                (f"{one}.down_proj{LORA_B}", 0.1 * torch.randn(hidden, rank)),
            ]
    q_proj = "model.layers.3.self_attn.q_proj"
    fan_out, fan_in = state[f"{q_proj}.weight"].shape
    return pairs + [
        (f"{q_proj}{LORA_A}", 0.1 * torch.randn(rank, fan_in)),
        (f"{q_proj}{LORA_B}", 0.1 * torch.randn(fan_out, rank)),
    ]


def test_per_expert_exports_become_the_fused_experts_adapters_that_peft_loads(tmp_path):
    """The expected model is built without gdnctl's fusing: each per-expert adapter is merged into the per-expert
    tensor of the same name in the checkpoint transformers' save_pretrained writes, and transformers fuses the
    experts when it loads that checkpoint. `peft` must give its logits from the fused adapters gdnctl writes."""
    import peft
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from gdnctl.runtime.model.lora_adapters import merge

    torch.manual_seed(0)
    base = _hf_model(TINY_MOE)
    base.save_pretrained(tmp_path / "base")
    pairs = _per_expert_bridge_exports(TINY_MOE, base.state_dict())
    stored = {
        name: tensor
        for file in sorted((tmp_path / "base").glob("*.safetensors"))
        for name, tensor in load_file(str(file)).items()
    }
    assert "model.layers.0.mlp.experts.1.gate_proj.weight" in stored  # save_pretrained writes experts per expert
    exported = dict(pairs)
    merged = {
        name: merge(
            tensor,
            Adapter(
                exported[f"{name.removesuffix('.weight')}{LORA_A}"], exported[f"{name.removesuffix('.weight')}{LORA_B}"]
            ),
            ALPHA,
        )
        if f"{name.removesuffix('.weight')}{LORA_A}" in exported
        else tensor
        for name, tensor in stored.items()
    }
    (tmp_path / "merged").mkdir()
    (tmp_path / "merged" / "config.json").write_text((tmp_path / "base" / "config.json").read_text())
    save_file(merged, str(tmp_path / "merged" / "model.safetensors"), metadata={"format": "pt"})

    adapters = lora_checkpoint.adapters_from_hf(pairs)
    routed = sorted(name for name in adapters if ".mlp.experts." in name)
    assert routed and all(name.endswith((".experts.gate_up_proj", ".experts.down_proj")) for name in routed)
    assert "model.layers.3.self_attn.q_proj.weight" in adapters
    spec = SPEC.model_copy(update={"rank": 4, "targets": ["attention_qkv", "experts"]})
    lora_checkpoint.write_peft(tmp_path, adapters, spec, base=str(tmp_path / "base"), durable=False)
    config = json.loads((tmp_path / "adapter" / CONFIG_FILE).read_text())
    assert config["target_parameters"] == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]

    expected = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    adapted = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    tokens = torch.randint(0, TINY_MOE.vocab_size, (2, 12))
    with torch.no_grad():
        got, want = adapted(tokens).logits, expected(tokens).logits
    assert not torch.allclose(want, _hf_model_logits(tmp_path / "base", tokens), atol=1e-3)  # the adapters show
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def _hf_model_logits(directory: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()(tokens).logits


def test_per_expert_adapters_that_do_not_fuse_are_refused():
    a = torch.zeros(2, 8)
    gate_only = {
        f"model.layers.0.mlp.experts.{expert}.gate_proj.weight": Adapter(a, torch.zeros(4, 2)) for expert in range(2)
    }
    with pytest.raises(ValueError, match="without both gate_proj and up_proj"):
        lora_checkpoint.fused_routed_experts(gate_only)
    gaps = {"model.layers.0.mlp.experts.1.down_proj.weight": Adapter(torch.zeros(2, 4), torch.zeros(8, 2))}
    with pytest.raises(ValueError, match=r"for experts \[1\]"):
        lora_checkpoint.fused_routed_experts(gaps)
    other_a = {
        f"model.layers.0.mlp.experts.0.{p}.weight": Adapter(torch.randn(2, 8), torch.zeros(4, 2))
        for p in ("gate_proj", "up_proj")
    }
    with pytest.raises(ValueError, match="different lora_A"):
        lora_checkpoint.fused_routed_experts(other_a)


def test_the_adapters_take_the_base_checkpoints_names():
    """A vision-language base keeps its language model under model.language_model.: the adapters name its
    modules as it stores them, so `peft` finds them on that class."""
    source = HFSource({}, language_model_prefix="model.language_model.")
    pairs = [
        ("model.layers.3.self_attn.q_proj.lora_A.weight", torch.zeros(2, 8)),
        ("model.layers.3.self_attn.q_proj.lora_B.weight", torch.zeros(6, 2)),
    ]
    assert list(lora_checkpoint.adapters_from_hf(pairs, source.stored_name)) == [
        "model.language_model.layers.3.self_attn.q_proj.weight"
    ]


def test_an_export_that_is_not_a_pair_of_lora_matrices_is_refused():
    with pytest.raises(ValueError, match="only lora_A of model.layers.0.mlp.up_proj"):
        lora_checkpoint.adapters_from_hf([("model.layers.0.mlp.up_proj.lora_A.weight", torch.zeros(2, 4))])
    with pytest.raises(ValueError, match="neither a lora_A nor a lora_B weight"):
        lora_checkpoint.adapters_from_hf([("model.layers.0.mlp.up_proj.weight", torch.zeros(2, 4))])


class _Wrapped(torch.nn.Module):
    """A linear as megatron-bridge's LoRALinear holds it: the frozen base under `to_wrap`, lora_A and lora_B under
    `adapter.linear_in` / `adapter.linear_out` (peft/adapter_wrapper.py, peft/utils.py ParallelLinearAdapter)."""

    def __init__(self, fan_in: int, fan_out: int, rank: int) -> None:
        super().__init__()
        self.to_wrap = torch.nn.Linear(fan_in, fan_out, bias=False)
        self.to_wrap.weight.requires_grad_(False)
        self.adapter = torch.nn.Module()
        self.adapter.linear_in = torch.nn.Linear(fan_in, rank, bias=False)
        self.adapter.linear_out = torch.nn.Linear(rank, fan_out, bias=False)


def _model(rank: int = 2) -> torch.nn.Module:
    model = torch.nn.Module()
    model.qkv = _Wrapped(8, 12, rank)
    model.fc1 = _Wrapped(8, 16, rank)
    model.norm = torch.nn.LayerNorm(8)
    model.norm.requires_grad_(False)
    return model


def test_a_resume_restores_each_ranks_adapters_exactly(tmp_path):
    model = _model()
    written = lora_checkpoint.write_shard(model, tmp_path, rank=3, durable=False)
    assert list(written) == ["adapter/rank-00003.safetensors"]
    saved = {name: param.detach().clone() for name, param in model.named_parameters()}
    other = _model()
    assert lora_checkpoint.load_shard(other, tmp_path, rank=3) == 4  # two linears, A and B each
    for name, param in other.named_parameters():
        if ".adapter." in name:
            assert torch.equal(param, saved[name]), name
        else:  # the base is model.path's, never the checkpoint's
            assert not torch.equal(param, saved[name]) or "norm" in name, name


def test_adapters_of_another_rank_are_refused_by_name(tmp_path):
    lora_checkpoint.write_shard(_model(rank=2), tmp_path, rank=0, durable=False)
    with pytest.raises(
        CheckpointError,
        match=r"qkv.adapter.linear_in.weight is \(2, 8\) in the checkpoint and "
        r"\(4, 8\) here.*train.lora and parallel settings",
    ):
        lora_checkpoint.load_shard(_model(rank=4), tmp_path, rank=0)
    with pytest.raises(CheckpointError, match="rank-00001.safetensors cannot be read"):
        lora_checkpoint.load_shard(_model(), tmp_path, rank=1)


def test_shard_problems_name_what_is_missing_extra_and_reshaped():
    problems = lora_checkpoint.shard_problems({"a": (2, 3), "b": (4,)}, {"a": (3, 2), "c": (1,)})
    assert problems == [
        "b is not in the checkpoint",
        "the checkpoint has c, which this model lacks",
        "a is (3, 2) in the checkpoint and (2, 3) here",
    ]


def test_only_adapters_train():
    model = _model()
    found = trainable((name, p.requires_grad, p.numel()) for name, p in model.named_parameters())
    assert found.adapter_names == (
        "qkv.adapter.linear_in.weight",
        "qkv.adapter.linear_out.weight",
        "fc1.adapter.linear_in.weight",
        "fc1.adapter.linear_out.weight",
    )
    assert found.adapter_params == 2 * (8 + 12) + 2 * (8 + 16)
    assert found.frozen_params == 8 * 12 + 8 * 16 + 2 * 8


def test_the_refusal_names_three_trainable_base_parameters_and_says_when_there_are_more():
    names = [(f"layer{index}.weight", True, 4) for index in range(3)]
    with pytest.raises(ModelBuildError, match=r"\(layer0.weight, layer1.weight, layer2.weight\), so"):
        trainable(names)
    with pytest.raises(ModelBuildError, match=r"layer2.weight, \.\.\.\), so"):
        trainable([*names, ("layer3.weight", True, 4)])


def test_a_trainable_base_or_a_frozen_adapter_stops_the_build():
    model = _model()
    model.norm.weight.requires_grad_(True)
    with pytest.raises(ModelBuildError, match="left base parameters trainable \\(norm.weight\\)"):
        trainable((name, p.requires_grad, p.numel()) for name, p in model.named_parameters())
    model = _model()
    model.fc1.adapter.linear_out.weight.requires_grad_(False)
    with pytest.raises(ModelBuildError, match="built frozen adapters \\(fc1.adapter.linear_out.weight\\)"):
        trainable((name, p.requires_grad, p.numel()) for name, p in model.named_parameters())


def test_the_fingerprint_is_exact_whatever_the_order_and_tells_any_change():
    torch.manual_seed(0)
    tensors = [("a", torch.randn(300, 7).bfloat16()), ("b", torch.randn(50))]
    first = lora_checkpoint.base_fingerprint(tensors)
    assert lora_checkpoint.base_fingerprint([(n, t.clone()) for n, t in tensors]) == first
    flipped = tensors[0][1].clone()
    flipped.view(torch.int16)[17, 3] ^= 1  # one bit of one element
    assert lora_checkpoint.base_fingerprint([("a", flipped), tensors[1]]) != first
    swapped = tensors[0][1].clone()
    swapped[[0, 1]] = swapped[[1, 0]]  # the same values, two rows exchanged
    assert lora_checkpoint.base_fingerprint([("a", swapped), tensors[1]]) != first
    assert lora_checkpoint.base_fingerprint([("a", tensors[0][1].float()), tensors[1]]) != first


def test_the_fingerprint_of_a_tensor_hashed_in_pieces_is_the_whole_ones(monkeypatch):
    tensors = [("w", torch.randn(1000).bfloat16())]
    whole = lora_checkpoint.base_fingerprint(tensors)
    monkeypatch.setattr(lora_checkpoint, "FINGERPRINT_PIECE", 64)
    assert lora_checkpoint.base_fingerprint(tensors) == whole


def _state(**lora_record) -> dict:
    state = {"iteration": 3, "consumed_samples": 24}
    if lora_record:
        state["lora"] = lora_checkpoint.state_record(SPEC, "/models/base", ["f0"]) | lora_record
    return state


def test_which_checkpoint_a_run_resumes():
    directory = Path("/ckpt/iter_0000003")
    assert lora_checkpoint.resume_problem(_state(), None, directory) is None
    assert lora_checkpoint.resume_problem(_state(rank=4), SPEC, directory) is None
    full = lora_checkpoint.resume_problem(_state(), SPEC, directory)
    assert full is not None and "full-parameter checkpoint" in full and "model.path to /ckpt/iter_0000003" in full
    adapters = lora_checkpoint.resume_problem(_state(rank=4), None, directory)
    assert adapters is not None and "holds LoRA adapters" in adapters
    assert "set train.lora as that run had it" in adapters
    other = lora_checkpoint.resume_problem(_state(rank=8), SPEC, directory)
    assert other is not None and "rank 8" in other and "train.lora asks for rank 4" in other


def test_expert_adapters_resume_only_as_they_were_saved():
    directory = Path("/ckpt/iter_0000003")
    on_experts = SPEC.model_copy(update={"targets": ["experts"], "target_modules": ["*.mlp.experts.linear_fc1"]})
    shared = on_experts.model_copy(update={"share_expert_adapters": True})
    saved_per_expert = _state(rank=4, targets=["experts"])
    assert saved_per_expert["lora"]["expert_adapters"] == "per_expert"
    assert lora_checkpoint.resume_problem(saved_per_expert, on_experts, directory) is None
    problem = lora_checkpoint.resume_problem(saved_per_expert, shared, directory)
    assert problem is not None
    assert "holds per_expert adapters on the routed experts" in problem and "asks for shared ones" in problem
    assert "set train.lora.expert_adapters: per_expert" in problem
    older = _state(rank=4, targets=["experts"])
    del older["lora"]["expert_adapters"]  # written before the setting: per-expert adapters
    assert lora_checkpoint.resume_problem(older, on_experts, directory) is None
    assert lora_checkpoint.resume_problem(older, shared, directory) is not None


def test_a_resume_on_another_base_is_refused():
    record = lora_checkpoint.state_record(SPEC, "/models/base", ["f0", "f1"])
    assert lora_checkpoint.base_problem(record, ["f0", "f1"], "/models/base") is None
    problem = lora_checkpoint.base_problem(record, ["f0", "changed"], "/models/base-v2")
    assert problem is not None
    assert "model.path /models/base-v2 differ" in problem and "the checkpoint's base was /models/base" in problem


def test_only_the_last_save_writes_the_merged_model():
    assert [lora_checkpoint.writes_merged(step, 6) for step in (3, 5, 6)] == [False, False, True]


def test_the_engine_config_names_megatron_bridges_target_modules(tmp_path):
    from gdnctl.plan import compile_engine_config
    from tests.validate.helpers import run_of, write_checkpoint

    base = write_checkpoint(tmp_path / "c")
    run = run_of(
        {
            "job": "sft",
            "rollout": None,
            "model": {"id": None, "path": str(base)},
            "parallel": {"ep": 8},
            "train": {"lora": {"rank": 8, "alpha": 16, "dropout": 0.1}},
        }
    )
    engine = compile_engine_config(run)
    assert engine.train.lora is not None
    assert engine.train.lora.targets == list(lora.default_targets(run.model))
    assert engine.train.lora.target_modules == lora.megatron_target_modules(lora.default_targets(run.model))
    assert (engine.train.lora.rank, engine.train.lora.alpha, engine.train.lora.dropout) == (8, 16.0, 0.1)


def test_an_adapters_only_checkpoint_named_as_model_path_says_where_the_model_is(tmp_path):
    from gdnctl.runtime.model import checkpoint

    adapters = {"model.layers.3.self_attn.q_proj.weight": Adapter(torch.zeros(2, 8), torch.zeros(6, 2))}
    lora_checkpoint.write_peft(tmp_path, adapters, SPEC, base="/models/base", durable=False)
    with pytest.raises(
        CheckpointError,
        match="holds LoRA adapters without the model .* at the base the adapters "
        "were trained on, or at the LoRA run's last checkpoint",
    ):
        checkpoint.HFReader(tmp_path)
