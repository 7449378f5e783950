"""Preset-level defaults (gdnctl/plan/decisions.py): each is a function of the preset and the GPU alone, so the
resolved Run is built from them without an import circle, and each says why."""

from __future__ import annotations

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
        name for name, _, _ in decisions.environment(run.preset, run.gpu)]
    shapes = run.gdn_rank_shapes()
    assert shapes[0].qk_heads == shapes[0].v_heads == run.model.linear_num_value_heads // preset.parallel.tp
