"""explain on image jobs: the vision tower and the longest prompt's image tokens in the memory estimate, and the
AReaL-shaped example (Qwen3.5-2B, images, GRPO on one 8-GPU node) explained and refused until rl takes images."""

from __future__ import annotations

from pathlib import Path

from gdnctl.plan import memory
from gdnctl.plan import run as facts
from gdnctl.validate import rules
from gdnctl.validate.loader import load_preset
from tests.validate.helpers import run_of

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vlm" / "qwen3.5-2b-geometry3k-grpo.yaml"


def _rows(run) -> dict:
    return {row.name: row for row in memory.estimate_training(run).rows}


def test_the_tower_row_counts_its_params_and_the_longest_prompts_image_tokens():
    images = {"max_per_sample": 2, "max_pixels": 1024 * 1024}
    frozen, trained = run_of({"train": {"images": images}}), run_of({"train": {"images": images, "vision": "train"}})
    vision = frozen.model.vision
    # 1024 x 1024 pixels in 32 x 32 merged blocks: 1,024 image tokens an image
    assert memory.image_tokens_of_longest_prompt(frozen) == 2 * 1024
    row = _rows(frozen)["vision tower"]
    assert f"{vision.params() / 1e6:.0f}M params, frozen" in row.note and "2,048 image tokens" in row.note
    assert row.gib >= 2 * vision.params() / memory.GIB
    assert _rows(trained)["vision tower"].gib > row.gib  # gradients, Adam state, every block's activations
    assert "vision tower" not in _rows(run_of({}))


def test_the_areal_shaped_example_explains_and_is_refused_only_for_images_on_gpus():
    preset = load_preset(EXAMPLE).preset
    assert preset is not None
    run = facts.resolve(preset)
    assert run.model.id == "Qwen/Qwen3.5-2B" and run.world_size.value == 8 and preset.train.images is not None
    assert "vision tower" in _rows(run)
    errors = {finding.code for finding in rules.check(run) if finding.severity.value == "error"}
    assert errors == {"IMG004"}
