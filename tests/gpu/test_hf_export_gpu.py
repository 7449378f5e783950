"""The Megatron trainer's checkpoints of a run started from model.path (`gdnctl launch`, one GPU): each holds
every tensor of the source under the source's names, the MTP head and a vision-language class's vision tower
byte for byte, and the source's config.json; a resumed run carries them on. The CPU tests check the same writer
(checkpoint.save_hf) on a module named like Megatron's (tests/runtime/model/test_passthrough.py) and the CPU
policy's saves served by vLLM (tests/runtime/rl/test_hf_export.py); this runs the trainer itself, with each
builder the machine has.

Needs a CUDA GPU, megatron-core and FLA; the megatron-bridge case also Transformer Engine and megatron-bridge.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from tests.gpu.test_trainer_gpu import _launch
from tests.runtime.rl.tiny_model import (
    DENSE,
    checkpoint_tensors,
    random_mtp_checkpoint,
    random_vision_language_checkpoint,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core"),
]
SOURCES = {"text-mtp": random_mtp_checkpoint, "vision-language": random_vision_language_checkpoint}
# runtime.transformer_engine picks the builder: none -> gdnctl's TE-free spec, a version -> megatron-bridge.
BUILDERS = {"te-free": "none", "megatron-bridge": "2.20.2"}
UNTRAINED = ("mtp.", "model.visual.")


def _builder_available(builder: str) -> bool:
    return builder == "te-free" or all(
        importlib.util.find_spec(module) is not None for module in ("transformer_engine", "megatron.bridge")
    )


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_trainer_checkpoints_keep_every_source_tensor_and_a_resume_carries_them_on(tmp_path, kind, builder):
    if not _builder_available(builder):
        pytest.skip(f"the {builder} builder needs Transformer Engine and megatron-bridge")
    source = SOURCES[kind](tmp_path / "source", seed=11)
    save_dir = tmp_path / "ckpt"
    common = [
        "kernels.gdn_backend=fla",
        f"model.id={DENSE}",
        f"model.path={tmp_path / 'source'}",
        f"runtime.transformer_engine={BUILDERS[builder]}",
        f"train.save_dir={save_dir}",
        "train.save_interval=1",
        "train.seq_length=256",
    ]
    _launch(tmp_path / "run", *common, "train.train_iters=2")
    _launch(tmp_path / "resumed", *common, "train.train_iters=3")  # resumes from iter_0000002, its source

    source_config = json.loads((tmp_path / "source" / "config.json").read_text())
    for step in (1, 2, 3):
        directory = save_dir / f"iter_{step:07d}"
        saved = checkpoint_tensors(directory)
        assert set(saved) == set(source), (step, sorted(set(saved) ^ set(source))[:8])
        for name, tensor in source.items():
            assert saved[name].shape == tensor.shape, (step, name)
            if name.startswith(UNTRAINED):
                assert torch.equal(saved[name], tensor), (step, name)
        assert json.loads((directory / "config.json").read_text()) == source_config, step
