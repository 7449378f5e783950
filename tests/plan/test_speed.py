"""The trainer's speed options (gdnctl/plan/speed.py): what `auto` picks for each builder and job, that a preset's
own value wins, and that the memory estimate follows the gradient dtype and the cross-entropy implementation."""

from __future__ import annotations

from gdnctl.plan import compile_engine_config, resolve
from gdnctl.plan.memory import estimate_training
from gdnctl.plan.speed import SPEED_OPTIONS, speed_options
from gdnctl.validate import load_preset

ALL_ON = {
    "router_fusion": True,
    "bias_activation_fusion": True,
    "rope_fusion": True,
    "cross_entropy": "te",
    "wgrad_fusion": True,
    "grad_reduce": "bf16",
    "manual_gc": True,
    "cuda_graphs": True,
    # One GPU: no gradients to reduce across ranks (and off with data parallel until measured there).
    "overlap_grad_reduce": False,
    "cutlass_grouped_gemm": True,
}


def _run(name: str, *overrides: str):
    loaded = load_preset(name, list(overrides))
    assert loaded.preset is not None, loaded.findings
    return resolve(loaded.preset)


def _values(run) -> dict:
    return {name: decision.value for name, decision in run.speed.items()}


def test_auto_turns_every_option_on_for_an_moe_sft_on_transformer_engine():
    run = _run("qwen3.5-35b-a3b-proxy-bench")
    assert tuple(run.speed) == SPEED_OPTIONS
    assert _values(run) == ALL_ON
    assert all(decision.reason for decision in run.speed.values())


def test_the_te_free_builder_keeps_megatron_cores_unfused_paths():
    decided = _values(_run("qwen3.5-35b-a3b-proxy-bench", "runtime.transformer_engine=none"))
    assert decided == {
        **ALL_ON,
        "router_fusion": False,
        "bias_activation_fusion": False,
        "rope_fusion": False,
        "cross_entropy": "native",
        "wgrad_fusion": False,
        "cuda_graphs": False,
        "cutlass_grouped_gemm": False,
    }


def test_the_gradient_reduction_overlaps_the_backward_pass_only_where_the_preset_says_so():
    one_rank = _run("qwen3.5-35b-a3b-proxy-bench").speed["overlap_grad_reduce"]
    assert one_rank.value is False and "one data-parallel rank" in one_rank.reason
    dp2 = _run("qwen3.5-35b-a3b-proxy-bench", "cluster.gpus_per_node=2", "train.global_batch_size=8")
    assert dp2.speed["overlap_grad_reduce"].value is False
    assert "measured 0.98x at DP2" in dp2.speed["overlap_grad_reduce"].reason
    on = _run("qwen3.5-35b-a3b-proxy-bench", "cluster.gpus_per_node=2", "speed.overlap_grad_reduce=on")
    assert compile_engine_config(on).speed.overlap_grad_reduce is True


def test_cutlass_grouped_gemm_is_on_only_where_transformer_engine_takes_it_and_the_scripts_export_it():
    proxy = _run("qwen3.5-35b-a3b-proxy-bench")
    assert proxy.speed["cutlass_grouped_gemm"].value is True
    assert ("NVTE_USE_CUTLASS_GROUPED_GEMM", "1") in [(name, value) for name, value, _ in proxy.environment]
    assert compile_engine_config(proxy).env["NVTE_USE_CUTLASS_GROUPED_GEMM"] == "1"
    # Where the experts run grouped GEMMs but CUTLASS would not take them, the scripts export 0: a value inherited
    # from the shell must not turn it on behind the preset's back.
    for overrides, why, exported in [
        (("cluster.gpu=a100",), "SM80: Transformer Engine's CUTLASS grouped GEMM runs on SM90 only", "0"),
        (("runtime.transformer_engine=2.7.0",), "Transformer Engine 2.7.0 has no CUTLASS grouped GEMM", "0"),
        (("train.precision=fp8",), "bf16 and fp16 GEMMs only", "0"),
        (("speed.cutlass_grouped_gemm=off",), "set in the preset", "0"),
        (("runtime.transformer_engine=none",), "no grouped GEMM", None),
    ]:
        run = _run("qwen3.5-35b-a3b-proxy-bench", *overrides)
        assert run.speed["cutlass_grouped_gemm"].value is False, overrides
        assert why in run.speed["cutlass_grouped_gemm"].reason, run.speed["cutlass_grouped_gemm"].reason
        assert {name: value for name, value, _ in run.environment}.get("NVTE_USE_CUTLASS_GROUPED_GEMM") == exported
    dense = _run("tiny-qwen3.5-sft")
    assert dense.speed["cutlass_grouped_gemm"].value is False and "dense" in dense.speed["cutlass_grouped_gemm"].reason
    assert "NVTE_USE_CUTLASS_GROUPED_GEMM" not in {name for name, _, _ in dense.environment}
    # The tiny MoE model's experts are 64 wide: CUTLASS needs each GEMM's K a multiple of 128.
    tiny_moe = _run(
        "tiny-qwen3.5-sft", "model.id=gdnctl/tiny-qwen3.5-moe-bytes", "runtime.transformer_engine=2.20.2"
    ).speed["cutlass_grouped_gemm"]
    assert tiny_moe.value is False and "multiples of 128" in tiny_moe.reason, tiny_moe.reason


def test_a_dense_model_has_no_router_to_fuse():
    run = _run("tiny-qwen3.5-sft")
    assert run.speed["router_fusion"].value is False
    assert "dense" in run.speed["router_fusion"].reason


def test_rl_accumulates_gradients_in_fp32_and_keeps_its_own_loss_and_pythons_collector():
    run = _run("qwen3.5-35b-a3b-grpo")
    assert run.speed["grad_reduce"].value == "fp32" and "rl" in run.speed["grad_reduce"].reason
    assert run.speed["cross_entropy"].value == "native" and "log-probs" in run.speed["cross_entropy"].reason
    assert run.speed["manual_gc"].value is False


def test_cuda_graphs_need_one_row_shape_and_the_layouts_they_have_run_in():
    """Graphs replay a recorded shape: on for the pretrain proxy (concatenated full rows, and filled packed rows),
    off where rows vary (whole documents: sft's default) or where gdnctl has not run them (pipeline or context
    parallel), and the engine config carries the warm-up steps before the capture only when they are on."""
    pretrain = _run("qwen3.5-35b-a3b-proxy-bench")
    assert pretrain.packing.value == "concat" and pretrain.speed["cuda_graphs"].value is True
    assert compile_engine_config(pretrain).speed.cuda_graph_warmup_steps == 1
    filled = _run("qwen3.5-35b-a3b-proxy-bench", "train.packing=fill")
    assert filled.speed["cuda_graphs"].value is True
    whole = _run("qwen3.5-35b-a3b-proxy-bench", "train.packing=whole")
    assert whole.speed["cuda_graphs"].value is False and "vary in length" in whole.speed["cuda_graphs"].reason
    assert compile_engine_config(whole).speed.cuda_graph_warmup_steps == 0
    assert _run("qwen3.5-35b-a3b-proxy-bench", "job=sft").speed["cuda_graphs"].value is False
    padded = _run("qwen3.5-35b-a3b-proxy-bench", "job=sft", "train.layout=bshd")
    assert padded.packing.value == "whole" and padded.speed["cuda_graphs"].value is True
    cp = _run("qwen3.5-35b-a3b-proxy-bench", "parallel.cp=2", "cluster.gpus_per_node=2")
    assert cp.speed["cuda_graphs"].value is False and "context parallel" in cp.speed["cuda_graphs"].reason


def test_attention_is_graphed_only_where_rows_carry_no_packed_sequence_offsets():
    """megatron-core replays a graphed attention without packed-sequence offsets, so attention (and with it the GDN
    blocks) joins the router graphs on full or padded rows only; explain says which it is."""
    full = _run("qwen3.5-35b-a3b-proxy-bench")
    assert compile_engine_config(full).speed.cuda_graph_modules == ("attn", "moe_router", "moe_preprocess")
    assert "attention or GDN block" in full.speed["cuda_graphs"].reason
    packed = _run("qwen3.5-35b-a3b-proxy-bench", "train.packing=fill")
    assert compile_engine_config(packed).speed.cuda_graph_modules == ("moe_router", "moe_preprocess")
    assert "stay eager on packed rows" in packed.speed["cuda_graphs"].reason
    off = _run("qwen3.5-35b-a3b-proxy-bench", "speed.cuda_graphs=off")
    assert compile_engine_config(off).speed.cuda_graph_modules == ()


def test_the_presets_own_value_wins_and_says_so():
    run = _run(
        "qwen3.5-35b-a3b-proxy-bench", "speed.cross_entropy=native", "speed.grad_reduce=fp32", "speed.router_fusion=off"
    )
    assert run.speed["cross_entropy"].value == "native"
    assert run.speed["grad_reduce"].value == "fp32"
    assert run.speed["router_fusion"].value is False
    assert run.speed["router_fusion"].reason == "set in the preset (speed.router_fusion: off)"


def test_the_engine_config_carries_the_values_and_their_reasons():
    run = _run("qwen3.5-35b-a3b-proxy-bench", "speed.manual_gc=off")
    speed = compile_engine_config(run).speed
    assert speed.manual_gc is False and speed.manual_gc_interval == 0
    assert speed.cross_entropy == "te" and speed.grad_reduce == "bf16"
    assert set(speed.reasons) == set(SPEED_OPTIONS)
    assert compile_engine_config(_run("qwen3.5-35b-a3b-proxy-bench")).speed.manual_gc_interval > 0


def test_memory_estimate_follows_gradient_dtype_and_cross_entropy():
    def rows(*overrides):
        return {row.name: row.gib for row in estimate_training(_run("qwen3.5-35b-a3b-proxy-bench", *overrides)).rows}

    fast, exact = rows(), rows("speed.grad_reduce=fp32", "speed.cross_entropy=native")
    assert exact["gradients"] == 2 * fast["gradients"]
    assert exact["logits"] == fast["logits"] * 6 / 4


def test_speed_options_is_a_pure_function_of_preset_model_and_stack():
    run = _run("qwen3.5-35b-a3b-proxy-bench")
    again = speed_options(run.preset, run.model, run.stack, run.dp)
    assert {name: d.value for name, d in again.items()} == _values(run)
