"""Which peak the first-minute memory check reads: CUDA's allocated peak, or its reserved peak where the trainer's
CUDA graphs keep the attention and GDN blocks' activations in their own pools (runtime/checks/first_minute.py)."""

from __future__ import annotations

from gdnctl.plan import compile_engine_config, resolve
from gdnctl.runtime.checks import FirstMinuteWatch, verdicts
from gdnctl.runtime.checks.verdicts import ExplainedMemory
from gdnctl.validate import load_preset


def _engine(*overrides: str):
    loaded = load_preset("qwen3.5-35b-a3b-proxy-bench", list(overrides))
    assert loaded.preset is not None, loaded.findings
    return compile_engine_config(resolve(loaded.preset))


def test_the_reserved_peak_is_read_where_graphs_cover_attention_and_the_allocated_one_elsewhere():
    graphed = FirstMinuteWatch(_engine(), print)
    assert graphed.reads_reserved
    assert graphed.source == "CUDA max reserved (CUDA graphs hold activations), most loaded rank"
    for overrides in (("train.packing=fill",), ("speed.cuda_graphs=off",)):
        watch = FirstMinuteWatch(_engine(*overrides), print)
        assert not watch.reads_reserved and watch.source == "CUDA max allocated, most loaded rank"


def test_the_warning_says_how_the_memory_was_measured():
    estimate = ExplainedMemory(total_gib=52.87, overhead_gib=3.0)
    assert "had 60.00 GiB reserved, 10.13 GiB (20%) more" in verdicts.memory_warning(60.0, estimate, 2, "reserved")
    assert "had 60.00 GiB allocated" in verdicts.memory_warning(60.0, estimate, 2)
