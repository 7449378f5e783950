"""A checkpoint's config.json (model.path) is read as JSON types, strictly, and as a bounded regular file: a value of
another type, or a FIFO, a device or a huge file in its place, is a PRE003 finding naming the key or the file
(exit 1), never a coerced architecture, a crash or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gdnctl.knowledge import HF_CONFIG_KEYS
from gdnctl.validate import validate
from tests.validate.helpers import TINY_MOE_TEXT, write_checkpoint

FLOATS = {"rms_norm_eps", "rope_theta", "partial_rotary_factor"}


def _finding(checkpoint):
    result = validate("qwen3.5-35b-a3b-sft", [f"model.path={checkpoint}", "model.id=null"])
    (finding,) = result.findings
    assert finding.code == "PRE003" and finding.path == "model.path"
    return finding.message


def _config(tmp_path, **top) -> dict:
    checkpoint = write_checkpoint(tmp_path / "ckpt")
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(top)
    (checkpoint / "config.json").write_text(json.dumps(config))
    return checkpoint


@pytest.mark.parametrize("key", sorted(HF_CONFIG_KEYS))
@pytest.mark.parametrize("value", [True, "8", [8], {"value": 8}])
def test_every_architecture_key_takes_only_its_json_type(tmp_path, key, value):
    message = _finding(write_checkpoint(tmp_path / "ckpt", **{key: value}))
    kind = "a number" if key in FLOATS else "an integer"
    assert f"text_config.{key} is {value!r}, not {kind}" in message


@pytest.mark.parametrize(
    ("top", "said"),
    [
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings is 'no', not true or false"),
        ({"tie_word_embeddings": 1}, "tie_word_embeddings is 1, not true or false"),
        ({"architectures": {"Qwen3_5MoeForConditionalGeneration": 1}}, "architectures is {"),
        ({"architectures": "Qwen3_5MoeForCausalLM"}, "not a list of strings"),
        ({"architectures": [1]}, "architectures is [1], not a list of strings"),
        ({"text_config": ["hidden_size"]}, "text_config is ['hidden_size'], not an object"),
    ],
)
def test_top_level_values_of_the_wrong_type_are_named(tmp_path, top, said):
    assert said in _finding(_config(tmp_path, **top))


def test_nested_values_of_the_wrong_type_are_named(tmp_path):
    assert "text_config.layer_types is ['linear_attention', 3]" in _finding(
        write_checkpoint(tmp_path / "a", layer_types=["linear_attention", 3])
    )
    assert "text_config.model_type is 5, not a string" in _finding(write_checkpoint(tmp_path / "d", model_type=5))
    assert "text_config.rope_parameters is [1]" in _finding(write_checkpoint(tmp_path / "b", rope_parameters=[1]))
    assert "text_config.rope_parameters.rope_theta is True, not a number" in _finding(
        write_checkpoint(tmp_path / "c", rope_parameters={"rope_theta": True})
    )


def test_values_of_the_right_type_are_read_as_written(tmp_path):
    checkpoint = _config(tmp_path, tie_word_embeddings=False)
    arch = validate("qwen3.5-35b-a3b-sft", [f"model.path={checkpoint}", "model.id=null"]).run.model
    assert arch.tie_word_embeddings is False and arch.num_layers == TINY_MOE_TEXT["num_hidden_layers"]
    (checkpoint / "config.json").write_text(
        json.dumps({**json.loads((checkpoint / "config.json").read_text()), "tie_word_embeddings": True})
    )
    assert (
        validate("qwen3.5-35b-a3b-sft", [f"model.path={checkpoint}", "model.id=null"]).run.model.tie_word_embeddings
        is True
    )


def _validate_in_a_process(checkpoint) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gdnctl",
            "validate",
            "qwen3.5-35b-a3b-sft",
            "--set",
            f"model.path={checkpoint}",
            "--set",
            "model.id=null",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda path: os.mkfifo(path), "is a named pipe (FIFO), not a regular file"),
        (lambda path: path.symlink_to("/dev/zero"), "is a device, not a regular file"),
        (lambda path: path.open("wb").truncate(5 * 1024**2), "is larger than 4 MiB"),
        (lambda path: path.mkdir(), "is a directory, not a regular file"),
    ],
)
def test_a_config_json_that_is_no_regular_file_is_refused_without_reading_it(tmp_path, make, said):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    make(checkpoint / "config.json")
    proc = _validate_in_a_process(checkpoint)
    finding = json.loads(proc.stdout)["findings"][0]
    assert proc.returncode == 1 and finding["code"] == "PRE003" and said in finding["message"]


def test_a_vision_language_checkpoint_gives_its_tower_and_its_processors_bounds(tmp_path):
    from gdnctl.knowledge import catalog

    directory = write_checkpoint(tmp_path / "vl")
    config = json.loads((directory / "config.json").read_text())
    config.update(vision_config={"depth": 3, "patch_size": 14, "out_hidden_size": 256}, image_token_id=7)
    (directory / "config.json").write_text(json.dumps(config))
    processing = {"size": {"shortest_edge": 3136, "longest_edge": 12845056}, "merge_size": 2, "image_mean": [0.1] * 3}
    (directory / "preprocessor_config.json").write_text(json.dumps(processing))
    vision = catalog.from_checkpoint(str(directory)).vision
    assert (vision.depth, vision.patch_size, vision.out_hidden_size, vision.image_token_id) == (3, 14, 256, 7)
    assert (vision.min_pixels, vision.max_pixels, vision.image_mean) == (3136, 12845056, (0.1, 0.1, 0.1))
    assert vision.hidden_size == 1152  # what the files leave out is the catalog's


def test_a_preprocessor_config_of_the_wrong_shape_is_refused_with_its_key(tmp_path):
    from gdnctl.knowledge import ModelNotFound, catalog

    directory = write_checkpoint(tmp_path / "vl")
    (directory / "preprocessor_config.json").write_text(json.dumps({"image_std": "wide"}))
    with pytest.raises(ModelNotFound, match="image_std is 'wide', not three numbers"):
        catalog.from_checkpoint(str(directory))


def test_a_text_only_checkpoint_has_no_tower(tmp_path):
    from gdnctl.knowledge import catalog

    directory = write_checkpoint(tmp_path / "text", architectures=["Qwen3_5MoeForCausalLM"])
    assert catalog.from_checkpoint(str(directory)).vision is None
