"""Tensor parallel above the KV heads (TP 4 over tiny Qwen3.5's 2 KV heads, TP 2 over tiny Qwen3-Next's 1): what
HEAD002 accepts, run through both builders with their HF loaders and exporters.

Megatron-Core >= 0.16 builds such a model by all-gathering the QKV activations over TP and giving each rank one
KV head and its share of the query heads; Transformer Engine's attention gets a config with as many groups as
TP ranks. This runs the whole path: the builder's model at that TP, its HF checkpoint (gathered over TP), then
transformers' logits against the model's, a fresh model loaded from the checkpoint, and a backward pass.

The ranks share one GPU and talk through gloo (tests/gpu/hf_roundtrip_check.py says why), so a session with one
GPU runs the layouts of a 4-GPU machine. Needs a CUDA GPU, megatron-core, FLA and transformers; the
megatron-bridge cases also Transformer Engine and megatron-bridge.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from tests.gpu.test_trainer_gpu import HERE, NEEDS_BRIDGE_STACK, _record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core"),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers"),
]

CASES = [
    pytest.param("te-free", "gdnctl/tiny-qwen3.5", 4, id="te-free-qwen3.5-tp4-kv2"),
    pytest.param("megatron-bridge", "gdnctl/tiny-qwen3.5", 4, id="bridge-qwen3.5-tp4-kv2", marks=NEEDS_BRIDGE_STACK),
    pytest.param(
        "megatron-bridge", "gdnctl/tiny-qwen3-next-bytes", 2, id="bridge-qwen3-next-tp2-kv1", marks=NEEDS_BRIDGE_STACK
    ),
]


@pytest.mark.parametrize("builder, model, tp", CASES)
def test_tp_above_the_kv_heads_round_trips_through_hf_and_trains(tmp_path, builder, model, tp):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={tp}",
        str(HERE / "hf_roundtrip_check.py"),
        str(tmp_path),
        model,
        builder,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    _record(f"tp_above_kv_{builder}_{model.split('/')[-1]}_tp{tp}", result)
    assert result["tp"] == tp and result["kv_heads"] < tp and result["kv_heads_per_rank"] == 1
    assert result["builder"] == builder
    assert result["before_reload_max_abs_diff"] > 0.1
    # The bridge's GDN output-norm mapping rounds twice (test_bridge_gpu.py); the TE-free writer is exact.
    reload_bound = 0.0 if builder == "te-free" else 0.05 * result["before_reload_max_abs_diff"]
    assert result["reload_max_abs_diff"] <= reload_bound
    assert result["transformers_relative_error"] < 0.02
    assert result["transformers_argmax_agreement"] > 0.98
    assert result["gradients_finite_on_every_rank"]
