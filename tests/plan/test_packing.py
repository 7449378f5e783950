"""train.packing (gdnctl/plan/decisions.py packing): what `auto` picks per job and layout, that the preset's own
value wins, and that explain and the engine config carry it."""

from __future__ import annotations

from gdnctl.plan import compile_engine_config, derived_values, resolve
from gdnctl.validate import load_preset


def _run(name: str, *overrides: str):
    loaded = load_preset(name, list(overrides))
    assert loaded.preset is not None, loaded.findings
    return resolve(loaded.preset)


def test_pretrain_concatenates_its_documents_into_full_rows_and_the_engine_config_says_so():
    run = _run("qwen3.5-35b-a3b-proxy-bench")
    assert (run.layout.value, run.packing.value) == ("bshd", "concat")
    assert "Megatron's GPT pretraining" in run.packing.reason
    assert "no padding and no per-document offsets" in run.layout.reason
    engine = compile_engine_config(run)
    assert (engine.layout, engine.packing) == ("bshd", "concat")
    assert any(d.name == "packing" and d.value == "concat" for d in derived_values(run))


def test_concatenated_rows_are_packed_where_context_parallel_splits_them():
    run = _run("qwen3.5-35b-a3b-proxy-bench", "parallel.cp=2", "cluster.gpus_per_node=2")
    assert (run.layout.value, run.packing.value) == ("thd", "concat")


def test_sft_keeps_each_document_whole_and_padded_rows_hold_one_each():
    sft = _run("qwen3.5-35b-a3b-proxy-bench", "job=sft")
    assert sft.packing.value == "whole" and "prompt" in sft.packing.reason
    padded = _run("qwen3.5-35b-a3b-proxy-bench", "job=sft", "train.layout=bshd")
    assert padded.packing.value == "whole" and "one document each" in padded.packing.reason
    assert compile_engine_config(padded).packing == "whole"
    assert not any(d.name == "packing" for d in derived_values(padded))  # BSHD has nothing to pack


def test_the_presets_own_packing_wins():
    run = _run("qwen3.5-35b-a3b-proxy-bench", "train.packing=fill")
    assert (run.layout.value, run.packing.value) == ("thd", "fill")
    assert run.packing.reason == "set in the preset (train.packing: fill)"
