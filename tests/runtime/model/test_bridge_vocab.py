"""The bridge builder's vocabulary at TP > 1: padded to a multiple of TP when the HF vocabulary is not one, and
cut back to the HF rows in what it exports (runtime/model/bridge.py; the GPU test that found it:
tests/gpu/test_tp_above_kv_heads_gpu.py, a 257-token model at TP 2)."""

from __future__ import annotations

import pytest
import torch

from gdnctl.launch.render import render
from gdnctl.runtime.model.bridge import as_stored_in_hf, provider_overrides
from gdnctl.schema.engine import EngineConfig


def _engine(tmp_path, model_id: str, tp: int) -> EngineConfig:
    render(
        "tiny-qwen3.5-sft",
        tmp_path,
        [
            f"model.id={model_id}",
            f"cluster.gpus_per_node={tp}",
            f"parallel.tp={tp}",
            "runtime.transformer_engine=2.20.2",
            "kernels.gdn_backend=fla",
        ],
    )
    return EngineConfig.from_file(tmp_path / "engine.yaml")


@pytest.mark.parametrize(
    "model_id, tp, padded",
    [
        ("gdnctl/tiny-qwen3-next-bytes", 2, True),  # 257 tokens
        ("gdnctl/tiny-qwen3-next-bytes", 1, False),
        ("gdnctl/tiny-qwen3.5", 4, False),  # 4096 tokens
    ],
)
def test_the_provider_pads_the_vocabulary_only_when_tp_does_not_divide_it(tmp_path, model_id, tp, padded):
    overrides = provider_overrides(_engine(tmp_path, model_id, tp))
    if padded:
        # Megatron then pads to the next multiple of make_vocab_size_divisible_by x TP: of TP alone, as the TE-free
        # builder does.
        assert overrides["should_pad_vocab"] is True and overrides["make_vocab_size_divisible_by"] == 1
    else:
        assert "should_pad_vocab" not in overrides


def test_the_export_drops_the_padding_rows_and_a_tied_lm_head(tmp_path):
    arch = _engine(tmp_path, "gdnctl/tiny-qwen3-next-bytes", 2).model
    rows = arch.vocab_size + 1
    exported = dict(
        as_stored_in_hf(
            arch,
            iter(
                [
                    ("model.embed_tokens.weight", torch.randn(rows, 8)),
                    ("lm_head.weight", torch.randn(rows, 8)),
                    ("model.norm.weight", torch.randn(8)),
                ]
            ),
        )
    )
    assert exported["model.embed_tokens.weight"].shape[0] == arch.vocab_size
    assert exported["lm_head.weight"].shape[0] == arch.vocab_size  # untied in Qwen3-Next: kept, cut
    assert exported["model.norm.weight"].shape == (8,)

    tied = arch.model_copy(update={"tie_word_embeddings": True})
    assert "lm_head.weight" not in dict(as_stored_in_hf(tied, iter([("lm_head.weight", torch.randn(rows, 8))])))
