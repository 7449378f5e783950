"""rl on image prompts on CPU: the count-the-squares toy task (examples/toy-vision) on the tiny vision-language
model, its images through vLLM's CPU build and the trainer's vision tower; and the CPU policy's tower, frozen or
trained, in process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gdnctl.schema.engine import EngineConfig
from tests.runtime.rl.test_rl_vllm import eval_rows, launch, metrics, needs_vllm

PRESET = "tiny-qwen3.5-vl-rl-cpu"


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


@needs_vllm
def test_the_reward_rises_on_image_prompts_with_the_tower_synced_and_checked(tmp_path):
    """One 8-step job of the shipped preset: every sample's image reaches vLLM and the trainer (the probe is an image
    prompt, whose expanded tokens vLLM scores one for one with the trainer), the engine's and the trainer's
    log-probs of the samples agree, the trained tower is synced and matched by checksum every step, the held-out
    evaluation runs on image prompts, and the mean reward rises."""
    from safetensors import safe_open

    run_dir = tmp_path / "run"
    save_dir = tmp_path / "checkpoints"
    result = launch(run_dir, "train.train_iters=8", "eval.interval=4", f"train.save_dir={save_dir}", preset=PRESET)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = metrics(run_dir)
    assert [s["step"] for s in steps] == list(range(1, 9))
    rewards = [round(s["reward_mean"], 3) for s in steps]
    # Measured: 0.016 0.018 0.022 0.026 ... 0.062 (0.141 by step 12); the held-out reward 0.027 -> 0.055 -> 0.166.
    assert _mean(r for r in rewards[-3:]) > _mean(r for r in rewards[:3]) + 0.02, rewards
    # 64 samples a step, one image each.
    assert {s["images"] for s in steps} == {64}
    # bf16 vLLM against the fp32 trainer on the same weights: measured 0.0013-0.0037 (samples), under 0.005 (probe).
    assert max(s["rollout_logprob_abs_diff"] for s in steps) < 0.02, steps
    assert max(s["probe_logprob_abs_diff"] for s in steps) < 0.02, steps
    # Every sync matched the tower's parameters by checksum too (the job stops on a mismatch): more parameters
    # than the language model's alone.
    assert "weight sync checked" in result.stdout
    assert [row["step"] for row in eval_rows(run_dir)] == [4, 8]
    # The trained tower is saved under its HF names, moved from its random init, with the image processor beside it.
    checkpoint = save_dir / "iter_0000008"
    assert (checkpoint / "preprocessor_config.json").is_file()
    weights = run_dir / "rollout" / "weights"
    assert {"tokenizer.json", "preprocessor_config.json", "config.json"} <= {p.name for p in weights.iterdir()}
    saved = {}
    for file in checkpoint.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            saved.update({name: handle.get_tensor(name) for name in handle.keys() if name.startswith("model.visual.")})
    initial = _initial_tower(run_dir / "engine.yaml")
    assert set(saved) == set(initial)
    assert any(not torch.equal(saved[name], initial[name]) for name in saved)


def _initial_tower(engine_yaml: Path) -> dict[str, torch.Tensor]:
    from gdnctl.runtime.model.vision_language import vision_language_model

    model = vision_language_model(EngineConfig.from_file(engine_yaml))
    return {name: tensor for name, tensor in model.state_dict().items() if name.startswith("model.visual.")}


@pytest.fixture
def vision_engine(tmp_path) -> EngineConfig:
    rendered = subprocess.run(
        [sys.executable, "-m", "gdnctl", "render", PRESET, "-o", str(tmp_path / "run")],
        text=True,
        capture_output=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    return EngineConfig.from_file(tmp_path / "run" / "engine.yaml")


def _image_samples(engine: EngineConfig, response: tuple[int, ...] | None = None) -> list:
    """Two samples of the dataset's first prompt with its image, advantages 1 and 0.5 (`response`: the tokens of
    " 3" unless given)."""
    from gdnctl.runtime.data.pipeline import load_tokenizer
    from gdnctl.runtime.rl.algorithm.batch import PromptPixels, Sample
    from gdnctl.runtime.rl.prompts import ImagePrompts
    from gdnctl.schema.image_data import ImageLimits

    data_path = Path(engine.train.data_path)
    record = json.loads(data_path.read_text().splitlines()[0])
    tokenizer = load_tokenizer(engine.train.tokenizer_path)
    prompts = ImagePrompts(engine.model.vision, ImageLimits(**engine.train.images.model_dump()))
    prompt = prompts.encode(record["prompt"], record["images"], tokenizer.encode, "test", data_path.parent)
    pixels = PromptPixels(prompt.pixel_values, prompt.image_grid_thw)
    response = response or tuple(tokenizer.encode(" 3"))
    return [
        Sample(0, tuple(prompt.token_ids), response, (-5.0,) * len(response), "stop", 1.0, advantage, images=pixels)
        for advantage in (1.0, 0.5)
    ]


@pytest.mark.parametrize("vision", ["frozen", "train"])
def test_a_frozen_tower_stays_as_loaded_and_a_trained_one_moves(vision_engine, gloo, vision):
    """One update on image rows: the language model moves either way; the tower only under train.vision: train.
    A vision token in a response scores at the bias the engine samples it with (prompts/images.py response_bias),
    so both sides hold the same distribution."""
    from gdnctl.runtime.rl.algorithm import batch as rl_batch
    from gdnctl.runtime.rl.policy.torch_vision_policy import TorchVisionPolicy

    engine = vision_engine.model_copy(update={"train": vision_engine.train.model_copy(update={"vision": vision})})
    policy = TorchVisionPolicy(engine)
    before = {name: p.detach().clone() for name, p in policy.module.named_parameters()}
    stats = policy.train_step([rl_batch.build_batch(_image_samples(engine), pad_id=0)], engine.grpo)
    assert stats["applied"] and stats["tokens"] > 0
    moved = {name for name, p in policy.module.named_parameters() if not torch.equal(p, before[name])}
    tower = {name for name in before if name.startswith("model.visual.")}
    assert moved - tower
    assert bool(moved & tower) == (vision == "train")
    # (An image token itself would be taken for an image's slot by the class, which is why neither side samples it.)
    banned = rl_batch.build_batch(_image_samples(engine, response=(engine.model.vision.vision_end_token_id,)), pad_id=0)
    (scored,) = policy.logprobs([banned])
    assert float(scored[banned.response_mask].max()) < -90


def test_a_checkpoint_of_the_vision_policy_resumes_to_the_same_weights(vision_engine, gloo, tmp_path):
    """A save after one update (the tower trained) writes the tower under its HF names and the image processor, and
    a policy started on that save dir resumes at its step with every weight and the optimizer's state as saved
    (measured end to end too: an image job of 2 steps resumed to 3 repeats the uninterrupted run's step 3)."""
    from gdnctl.runtime.rl.algorithm import batch as rl_batch
    from gdnctl.runtime.rl.policy.torch_vision_policy import TorchVisionPolicy

    save_dir = tmp_path / "checkpoints"
    train = vision_engine.train.model_copy(update={"vision": "train", "save_dir": str(save_dir)})
    engine = vision_engine.model_copy(update={"train": train})
    policy = TorchVisionPolicy(engine)
    policy.train_step([rl_batch.build_batch(_image_samples(engine), pad_id=0)], engine.grpo)
    policy.save(save_dir, 1)
    assert (save_dir / "iter_0000001" / "preprocessor_config.json").is_file()
    resumed = TorchVisionPolicy(engine)
    assert resumed.step == 1
    saved = policy.module.state_dict()
    assert all(torch.equal(tensor, saved[name]) for name, tensor in resumed.module.state_dict().items())
    first = policy.optimizer.state_dict()["state"]
    again = resumed.optimizer.state_dict()["state"]
    assert first.keys() == again.keys()
    assert all(torch.equal(first[key]["exp_avg"], again[key]["exp_avg"]) for key in first)
