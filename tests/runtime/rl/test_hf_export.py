"""HF -> gdnctl -> HF through the CPU rl policy: a checkpoint it saves holds every tensor of the checkpoint it
started from (the MTP head, and for the vision-language class the vision tower, byte for byte), under the
source's own names, with the source's config.json; a resume carries them on; the rollout's export stays the
text-only class. With GDNCTL_TEST_VLLM_PYTHON set, vLLM (its CPU build) serves the saved checkpoints with MTP
speculative decoding."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gdnctl.knowledge.catalog import from_checkpoint
from gdnctl.runtime.model.passthrough import PASSTHROUGH_FILE
from gdnctl.runtime.rl.algorithm import batch as rl_batch
from gdnctl.schema.engine import EngineConfig
from tests.runtime.rl.test_rl_vllm import PRESET, VLLM_PYTHON, needs_vllm, vllm_env
from tests.runtime.rl.test_torch_policy import samples
from tests.runtime.rl.tiny_model import (
    DENSE,
    IMAGE_PROCESSOR_FILE,
    checkpoint_tensors,
    random_mtp_checkpoint,
    random_vision_language_checkpoint,
)
from tests.runtime.rl.vllm_generate_check import NEW_TOKENS, RESULT_PREFIX

HERE = Path(__file__).parent
SOURCES = {"text-mtp": random_mtp_checkpoint, "vision-language": random_vision_language_checkpoint}
UNTRAINED = ("mtp.", "model.visual.")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> EngineConfig:
    run_dir = tmp_path_factory.mktemp("run")
    done = subprocess.run(
        [sys.executable, "-m", "gdnctl", "render", PRESET, "-o", str(run_dir), "--force"],
        text=True,
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return EngineConfig.from_file(run_dir / "engine.yaml")


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _from_source(engine: EngineConfig, source: Path, save_dir: Path) -> EngineConfig:
    """The rl engine config on model.path `source` (its config.json is the architecture, as validate reads it)."""
    return engine.model_copy(
        update={
            "model": from_checkpoint(str(source), DENSE),
            "train": engine.train.model_copy(update={"save_dir": str(save_dir)}),
        }
    )


def _train_and_save(config: EngineConfig, save_dir: Path, step: int):
    from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy

    policy = TorchPolicy(config)
    policy.train_step([rl_batch.build_batch(samples(), pad_id=256)], config.grpo)
    policy.save(save_dir, step)
    return policy


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_a_saved_checkpoint_is_the_source_with_the_trained_weights_swapped_in(rendered, gloo, tmp_path, kind):
    source = SOURCES[kind](tmp_path / "source", seed=5)
    config = _from_source(rendered, tmp_path / "source", tmp_path / "ckpt")

    policy = _train_and_save(config, tmp_path / "ckpt", 1)

    saved = checkpoint_tensors(tmp_path / "ckpt" / "iter_0000001")
    assert set(saved) == set(source)  # every tensor, under the source's own names
    trained = [name for name in source if not name.startswith(UNTRAINED)]
    for name, tensor in source.items():
        assert saved[name].shape == tensor.shape, name
        if name.startswith(UNTRAINED):
            assert saved[name].dtype == tensor.dtype and torch.equal(saved[name], tensor), name
    assert any(not torch.equal(saved[name].bfloat16(), source[name]) for name in trained), "nothing was trained"
    source_config = json.loads((tmp_path / "source" / "config.json").read_text())
    assert json.loads((tmp_path / "ckpt" / "iter_0000001" / "config.json").read_text()) == source_config
    text_config = source_config.get("text_config", source_config)
    assert text_config["mtp_num_hidden_layers"] == 1
    assert ("vision_config" in source_config) == (kind == "vision-language")

    # The rollout serves the text-only class: its weights are the language model's, nothing carried over.
    written = policy.export(tmp_path / "rollout")
    assert set(written) == {name.replace("model.language_model.", "model.") for name in trained}
    rollout_config = json.loads((tmp_path / "rollout" / "config.json").read_text())
    assert rollout_config["architectures"] == ["Qwen3_5ForCausalLM"] and rollout_config["mtp_num_hidden_layers"] == 0


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_a_resumed_run_carries_the_untrained_tensors_on(rendered, gloo, tmp_path, kind):
    SOURCES[kind](tmp_path / "source", seed=6)
    config = _from_source(rendered, tmp_path / "source", tmp_path / "ckpt")
    _train_and_save(config, tmp_path / "ckpt", 1)

    resumed = _train_and_save(config, tmp_path / "ckpt", 2)  # resumes from iter_0000001, its source now

    assert resumed.step == 1
    first, second = tmp_path / "ckpt" / "iter_0000001", tmp_path / "ckpt" / "iter_0000002"
    assert set(checkpoint_tensors(second)) == set(checkpoint_tensors(first))
    for file in (PASSTHROUGH_FILE, "config.json"):
        assert (second / file).read_bytes() == (first / file).read_bytes(), file


def _serving_files(source: Path, checkpoint: Path, tokenizer: Path) -> None:
    """What gdnctl does not write beside the weights and config.json, copied as a user serving the checkpoint
    would: the tokenizer, and a vision-language class's image processor config."""
    for file in tokenizer.iterdir():
        shutil.copy(file, checkpoint / file.name)
    if (source / IMAGE_PROCESSOR_FILE).exists():
        shutil.copy(source / IMAGE_PROCESSOR_FILE, checkpoint / IMAGE_PROCESSOR_FILE)


@needs_vllm
@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_vllm_serves_the_saved_checkpoint_with_its_mtp_layer_drafting(rendered, gloo, tmp_path, kind):
    SOURCES[kind](tmp_path / "source", seed=7)
    config = _from_source(rendered, tmp_path / "source", tmp_path / "ckpt")
    _train_and_save(config, tmp_path / "ckpt", 1)
    saved = tmp_path / "ckpt" / "iter_0000001"
    _serving_files(tmp_path / "source", saved, Path(config.train.tokenizer_path))

    done = subprocess.run(
        [VLLM_PYTHON, str(HERE / "vllm_generate_check.py"), str(saved)],
        text=True,
        capture_output=True,
        timeout=600,
        env=vllm_env(),
        check=False,
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(
        next(line[len(RESULT_PREFIX) :] for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX))
    )
    expected_class = "Qwen3_5ForConditionalGeneration" if kind == "vision-language" else "Qwen3_5ForCausalLM"
    assert result["architectures"] == [expected_class]
    assert len(result["tokens"]) == NEW_TOKENS
    # The MTP drafter proposed a token at every decode step after the prefill's (vLLM builds it from the mtp.*
    # tensors and refuses to start without them).
    assert result["spec_decode"]["vllm:spec_decode_num_drafts"] >= NEW_TOKENS - 1, result
