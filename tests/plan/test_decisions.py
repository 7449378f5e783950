"""Preset-level defaults (gdnctl/plan/decisions.py): each is a function of the preset and the GPU alone, so the
resolved Run is built from them without an import circle, and each says why."""

from __future__ import annotations

import pytest

from gdnctl.knowledge import GPUS
from gdnctl.plan import decisions, resolve
from gdnctl.validate import load_preset


def _preset(*overrides: str):
    loaded = load_preset("qwen3.5-35b-a3b-grpo", list(overrides))
    assert loaded.preset is not None, loaded.findings
    return loaded.preset


def test_layout_follows_megatron_core_unless_the_preset_says():
    assert decisions.layout(_preset(), {"megatron_core": "0.19.2"}).value == "thd"
    old = decisions.layout(_preset(), {"megatron_core": "0.17.0"})
    assert old.value == "bshd" and "NotImplementedError" in old.reason
    assert decisions.layout(_preset("train.layout=bshd"), {"megatron_core": "0.19.2"}).value == "bshd"


def test_sequence_parallel_is_on_exactly_when_tp_shards():
    assert decisions.sequence_parallel(_preset("parallel.tp=2")).value is True
    assert decisions.sequence_parallel(_preset("parallel.tp=1", "parallel.ep=1")).value is False


def test_a_separate_rollout_takes_half_the_gpus_unless_told():
    separate = _preset("rollout.colocate=false")
    assert decisions.rollout_gpus(separate, 16).value == 8
    assert decisions.train_world_size(separate, 16).value == 8
    assert decisions.rollout_gpus(_preset(), 16).value == 16  # colocated: vLLM shares every GPU


def test_cuda_connections_depend_on_the_gpu_not_on_a_run():
    tp2 = _preset("parallel.tp=2")
    assert decisions.cuda_device_max_connections(tp2, GPUS["h100"]).value == "1"
    assert decisions.cuda_device_max_connections(tp2, GPUS["b200"]).value == "32"
    assert decisions.cuda_device_max_connections(tp2, GPUS["cpu"]).value is None


def test_the_run_exposes_the_decisions_it_was_built_from():
    preset = _preset()
    run = resolve(preset)
    assert run.layout == decisions.layout(preset, run.stack)
    assert run.sequence_parallel == decisions.sequence_parallel(preset)
    assert [name for name, _, _ in decisions.environment(preset, run.gpu)] == [
        name for name, _, _ in decisions.environment(run.preset, run.gpu)
    ]
    shapes = run.gdn_rank_shapes()
    assert shapes[0].qk_heads == shapes[0].v_heads == run.model.linear_num_value_heads // preset.parallel.tp


def test_the_weight_transport_is_in_memory_exactly_where_it_can_run():
    te = {"transformer_engine": "2.20.2"}
    assert decisions.rollout_weight_transport(_preset(), GPUS["h100"], te).value == "cuda_ipc"
    cpu = decisions.rollout_weight_transport(_preset(), GPUS["cpu"], te)
    assert cpu.value == "disk" and "CPU build" in cpu.reason
    # A rollout on GPUs of its own gets the broadcast; CUDA IPC cannot reach it.
    separate = _preset("rollout.colocate=false")
    assert decisions.rollout_weight_transport(separate, GPUS["h100"], te).value == "broadcast"
    ipc_separate = decisions.rollout_weight_transport(
        _preset("rollout.colocate=false", "rollout.weight_sync=cuda_ipc"), GPUS["h100"], te
    )
    assert ipc_separate.value == "disk" and "separate placement" in ipc_separate.reason
    # NCCL refuses two ranks of one group on one GPU, which a colocated broadcast would need; on CPU gloo serves.
    colocated = decisions.rollout_weight_transport(_preset("rollout.weight_sync=broadcast"), GPUS["h100"], te)
    assert colocated.value == "disk" and "NCCL refuses" in colocated.reason
    assert (
        decisions.rollout_weight_transport(_preset("rollout.weight_sync=broadcast"), GPUS["cpu"], te).value
        == "broadcast"
    )
    # The TE-free builder gathers over TP only: with ep > 1 no rank holds every expert.
    for preset in (_preset("parallel.ep=8"), _preset("parallel.ep=8", "rollout.colocate=false")):
        te_free = decisions.rollout_weight_transport(preset, GPUS["h100"], {"transformer_engine": None})
        assert te_free.value == "disk" and "TE-free" in te_free.reason
    assert decisions.rollout_weight_transport(_preset("rollout.weight_sync=disk"), GPUS["h100"], te).value == "disk"


def test_qwen35_is_served_as_the_vision_language_class_before_vllm_027():
    preset = _preset()
    model = resolve(preset).model
    assert decisions.rollout_class(preset, model, {"vllm": "0.26.0"}).value == "vision-language"
    assert decisions.rollout_class(preset, model, {"vllm": "0.27.0"}).value == "text"
    next_preset = load_preset("qwen3-next-80b-a3b-grpo", []).preset
    assert decisions.rollout_class(next_preset, resolve(next_preset).model, {"vllm": "0.26.0"}).value == "text"


def test_image_prompts_are_served_by_the_vision_language_class_with_its_tower_on_any_vllm():
    preset = load_preset("tiny-qwen3.5-vl-rl-cpu", []).preset
    model = resolve(preset).model
    for vllm in ("0.26.0", "0.32.0"):
        decision = decisions.rollout_class(preset, model, {"vllm": vllm})
        assert decision.value == "vision-language with its tower"
        assert "Qwen3_5ForConditionalGeneration" in decision.reason and "1 image(s) a prompt" in decision.reason


def test_explain_shows_both_phases_of_a_colocated_rl_job():
    from gdnctl.plan.memory import estimate_rollout_phase

    run = resolve(_preset())
    phase = estimate_rollout_phase(run)
    names = [row.name for row in phase.rows]
    assert names == ["weights", "gradients", "optimizer", "vLLM", "overhead"]
    vllm = phase.rows[names.index("vLLM")]
    assert vllm.gib == run.preset.rollout.gpu_memory_utilization * run.gpu.memory_gib
    assert estimate_rollout_phase(resolve(_preset("rollout.colocate=false"))) is None


def test_the_lr_schedule_warms_up_by_default_and_decays_by_job():
    rl = decisions.lr_schedule(_preset("train.train_iters=200"))
    assert (rl["warmup_steps"].value, rl["decay"].value, rl["min_lr"].value) == (20, "constant", 1e-6)
    sft = decisions.lr_schedule(load_preset("qwen3.5-9b-sft", ["train.train_iters=50000"]).preset)
    assert sft["warmup_steps"].value == 1_000 and sft["decay"].value == "cosine"
    assert sft["min_lr"].value == pytest.approx(sft_lr() / 10)
    chosen = decisions.lr_schedule(_preset("train.lr_warmup_steps=0", "train.lr_decay=linear", "train.min_lr=0"))
    assert (chosen["warmup_steps"].value, chosen["decay"].value, chosen["min_lr"].value) == (0, "linear", 0.0)
    assert all("set in the preset" in decision.reason for decision in chosen.values())


def sft_lr() -> float:
    return load_preset("qwen3.5-9b-sft", []).preset.train.lr


def test_explain_and_the_engine_config_carry_the_schedule_ppo_and_eval(tmp_path):
    from gdnctl.plan import compile_engine_config, derived_values

    (tmp_path / "heldout.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    run = resolve(
        _preset(
            "grpo.mini_batches=4", "grpo.epochs=2", f"eval.data_path={tmp_path / 'heldout.jsonl'}", "eval.interval=5"
        )
    )
    shown = {d.name: d for d in derived_values(run)}
    assert shown["lr_schedule"].value.startswith("warmup 10 steps to 1e-06, then constant")
    assert shown["ppo_updates"].value == "8 optimizer steps per rollout step" and "clip" in shown["ppo_updates"].reason
    assert shown["rollout_correction"].value == "off"
    assert shown["eval"].value == "every 5 steps and after the last" and "eval_reward rows" in shown["eval"].reason
    assert shown["overlong_prompts"].value == "drop" and "left out and named" in shown["overlong_prompts"].reason
    engine = compile_engine_config(run)
    assert (engine.train.lr_warmup_steps, engine.train.lr_decay) == (10, "constant")
    assert (engine.grpo.mini_batches, engine.grpo.epochs) == (4, 2)
    assert engine.eval.interval == 5 and engine.eval.max_response_tokens == run.preset.rollout.max_response_tokens


def test_torch_compile_is_on_where_the_te_trainer_trains_one_row_shape_and_off_elsewhere():
    te = {"transformer_engine": "2.20.2", "megatron_bridge": "0.6.2", "megatron_core": "0.19.2"}
    h100 = GPUS["h100"]
    pretrain = load_preset("qwen3.5-35b-a3b-proxy-bench", []).preset  # pretrain: filled rows
    on = decisions.torch_compile(pretrain, te, h100)
    assert on.value is True and "82 ms shorter" in on.reason
    assert decisions.torch_compile(_preset(), te, h100).value is False  # rl
    sft = load_preset("qwen3.5-35b-a3b-sft", []).preset  # whole documents per packed row
    whole = decisions.torch_compile(sft, te, h100)
    assert whole.value is False and "recompiles" in whole.reason
    padded = load_preset("qwen3.5-35b-a3b-sft", ["train.layout=bshd"]).preset
    assert decisions.torch_compile(padded, te, h100).value is True
    te_free = decisions.torch_compile(pretrain, {**te, "transformer_engine": None}, h100)
    assert te_free.value is False and "TE-free" in te_free.reason
    assert decisions.torch_compile(pretrain, te, GPUS["cpu"]).value is False


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("false", False), ("on", True), ("off", False)])
def test_a_torch_compile_set_in_the_preset_wins(value, expected):
    preset = load_preset("qwen3.5-35b-a3b-sft", [f"kernels.torch_compile={value}"]).preset
    for software in ({"transformer_engine": "2.20.2"}, {"transformer_engine": None}):
        decided = decisions.torch_compile(preset, software, GPUS["h100"])
        assert decided.value is expected and "set in the preset" in decided.reason


def test_a_save_dir_without_an_interval_saves_every_tenth_of_the_run():
    assert decisions.save_interval(_preset()).value is None  # no save_dir: nothing to save
    tenth = decisions.save_interval(_preset("train.save_dir=/ckpt", "train.train_iters=1000"))
    assert tenth.value == 100 and "a tenth of train_iters 1000" in tenth.reason
    assert decisions.save_interval(_preset("train.save_dir=/ckpt", "train.train_iters=7")).value == 1
    assert decisions.save_interval(_preset("train.save_dir=/ckpt", "train.save_interval=3")).value == 3


def test_the_importance_weight_is_on_whenever_the_loop_is_off_policy():
    assert decisions.importance_weight(_preset()).value is False
    assert decisions.importance_weight(_preset("grpo.rollout_correction=true")).value is True
    off_policy = decisions.importance_weight(_preset("rollout.max_staleness=1", "rollout.colocate=false"))
    assert off_policy.value is True and "proximal" in off_policy.reason


def test_engines_are_restarted_only_where_trainer_rank_0_started_them():
    assert decisions.engine_restarts(_preset()).value == 2
    assert decisions.engine_restarts(_preset("rollout.max_engine_restarts=0")).value == 0
    slurm_step = decisions.engine_restarts(_preset("rollout.colocate=false", "launch.executor=slurm"))
    assert slurm_step.value == 0 and "rollout step" in slurm_step.reason
    nodes = decisions.engine_restarts(_preset("cluster.nodes=2"))
    assert nodes.value == 0 and "several nodes" in nodes.reason


def test_an_rl_job_trains_padded_rows_whatever_train_layout_says():
    rows = decisions.rl_rows(_preset("train.layout=thd"))
    assert rows.value == "padded rows (bshd)" and "not read" in rows.reason
