"""sft on records with images, end to end on CPU: `gdnctl launch` of the tiny random-weight VL model
(gdnctl/tiny-qwen3.5-vl-bytes, its processor from the catalog: nothing downloaded) on generated colour images."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image
from safetensors import safe_open

from gdnctl.knowledge import catalog

REPO = Path(__file__).resolve().parents[3]
TINY_VL = "gdnctl/tiny-qwen3.5-vl-bytes"
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}


def _dataset(directory: Path, count: int = 24, seed: int = 0) -> Path:
    """A square of one colour per record (its size varies, so records hold 4 to 16 image tokens), the colour to
    name."""
    directory.mkdir(parents=True, exist_ok=True)
    chooser = random.Random(seed)
    lines = []
    for index in range(count):
        name = chooser.choice(sorted(COLOURS))
        side = chooser.choice((32, 48, 64))
        Image.new("RGB", (side, side), COLOURS[name]).save(directory / f"{index}.png")
        lines.append(json.dumps({"prompt": "<image>colour:", "response": name, "images": [f"{index}.png"]}))
    path = directory / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _launch(
    tmp: Path, name: str, data: Path, model_path: Path | None = None, fails: bool = False, processes: int = 1, **train
) -> Path:
    evaluation = train.pop("eval", None)
    model = {"id": TINY_VL, "tokenizer": str(REPO / "examples/toy-rl/tokenizer")}
    preset = {
        "name": name,
        "job": "sft",
        "model": {**model, "path": str(model_path) if model_path else None},
        "cluster": {"nodes": 1, "gpus_per_node": processes, "gpu": "cpu"},
        "train": {
            "data_path": str(data),
            "images": {"max_per_sample": 1},
            "micro_batch_size": 8,
            "global_batch_size": 8,
            "seq_length": 64,
            "lr": 3.0e-3,
            "train_iters": 12,
            **train,
        },
        "launch": {"executor": "local"},
    }
    if evaluation is not None:
        preset["eval"] = evaluation
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(preset))
    run_dir = tmp / f"{name}-run"
    result = subprocess.run(
        [sys.executable, "-m", "gdnctl", "launch", str(path), "-o", str(run_dir), "--force"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))},
    )
    assert (result.returncode != 0) == fails, result.stdout + result.stderr
    return run_dir


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _losses(run_dir: Path) -> list[float]:
    rows = _rows(run_dir)
    assert all(row["image_tokens"] > 0 for row in rows)
    return [row["loss"] for row in rows]


def _tensors(directory: Path) -> dict:
    index = directory / "model.safetensors.index.json"
    files = set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}
    tensors = {}
    for file in files:
        with safe_open(str(directory / file), framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    return tensors


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """12 steps from random weights, evaluated every 4 on held-out records and saved at the end: the start of the
    other runs."""
    tmp = tmp_path_factory.mktemp("vl")
    data = _dataset(tmp / "data")
    held_out = _dataset(tmp / "held-out", count=8, seed=1)
    evaluation = {"data_path": str(held_out), "interval": 4}
    run_dir = _launch(tmp, "random", data, save_dir=str(tmp / "random-save"), save_interval=12, eval=evaluation)
    return tmp, data, run_dir, tmp / "random-save" / "iter_0000012"


def test_loss_falls_on_image_prompts(first_run):
    _, _, run_dir, _ = first_run
    losses = _losses(run_dir)
    assert len(losses) == 12 and losses[-1] < 0.5 * losses[0], losses


def test_the_held_out_loss_falls_too(first_run):
    _, _, run_dir, _ = first_run
    held_out = [(row["step"], row["eval_loss"]) for row in _rows(run_dir) if "eval_loss" in row]
    assert [step for step, _ in held_out] == [4, 8, 12] and held_out[-1][1] < held_out[0][1], held_out


def test_a_resumed_run_continues_from_its_last_checkpoint(first_run, tmp_path):
    _, data, _, _ = first_run
    save_dir = tmp_path / "save"
    run_dir = _launch(tmp_path, "resumed", data, train_iters=2, save_dir=str(save_dir), save_interval=1)
    first = _losses(run_dir)
    (run_dir / "metrics.jsonl").unlink()
    # the same preset with two more steps: the job takes the weights, optimizer state and step of save_dir/latest
    rows = _rows(_launch(tmp_path, "resumed", data, train_iters=4, save_dir=str(save_dir), save_interval=1))
    assert [row["step"] for row in rows] == [3, 4]
    uninterrupted = _launch(tmp_path, "straight", data, train_iters=4)
    assert _losses(uninterrupted)[:2] == first
    assert [round(loss, 4) for loss in _losses(uninterrupted)[2:]] == [round(row["loss"], 4) for row in rows]


def test_a_run_from_random_weights_saves_the_vision_language_class_with_its_tower(first_run):
    *_, saved = first_run
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"] and config["vision_config"]["depth"] == 2
    names = _tensors(saved)
    assert any(name.startswith("model.visual.") for name in names)
    # read back as model.path alone (no model.id to fall back on), it is the same architecture, processor included
    assert catalog.from_checkpoint(str(saved)).vision == catalog.from_catalog(TINY_VL).vision
    assert any(name.startswith("model.language_model.layers.") for name in names)


@pytest.mark.parametrize("vision", ["frozen", "train"])
def test_a_frozen_tower_is_carried_over_unchanged_and_a_trained_one_saved_changed(first_run, vision):
    tmp, data, _, saved = first_run
    save_dir = tmp / f"{vision}-save"
    _launch(tmp, vision, data, saved, vision=vision, train_iters=3, save_dir=str(save_dir), save_interval=3)
    before, after = _tensors(saved), _tensors(save_dir / "iter_0000003")
    assert set(before) == set(after)
    tower = [name for name in before if name.startswith("model.visual.")]
    language = [name for name in before if not name.startswith("model.visual.")]
    assert any(not before[name].equal(after[name]) for name in language)
    changed = [name for name in tower if not before[name].equal(after[name])]
    if vision == "frozen":
        assert changed == []
        index = json.loads((save_dir / "iter_0000003" / "model.safetensors.index.json").read_text())["weight_map"]
        assert {index[name] for name in tower} == {"passthrough.safetensors"}
    else:
        assert changed


def test_non_finite_steps_are_skipped_up_to_the_limit_then_stop_the_job(first_run, tmp_path):
    _, data, _, _ = first_run
    # an lr of 1e30: the first update puts weights of about 1e30 in, whose products overflow: every later loss NaN
    run_dir = _launch(tmp_path, "diverged", data, fails=True, lr=1.0e30, train_iters=6, skip_nonfinite_steps=2)
    rows = _rows(run_dir)
    assert [row["applied"] for row in rows] == [True, False, False]
    log = "".join(path.read_text() for path in (run_dir / "logs").rglob("*") if path.is_file())
    assert "step 4's loss or gradient is not finite (after 2 skipped step(s)" in log


def test_two_processes_take_the_same_steps_as_one(first_run, tmp_path):
    _, data, _, _ = first_run
    one = _losses(_launch(tmp_path, "one", data, train_iters=3, micro_batch_size=4))
    two = _losses(_launch(tmp_path, "two", data, train_iters=3, micro_batch_size=4, processes=2))
    assert [round(loss, 4) for loss in one] == [round(loss, 4) for loss in two], (one, two)
