"""A model.path that is not on this machine: a preset for a Slurm cluster, checked and rendered on a laptop, uses
the catalog's architecture of model.id and says so (LCH008); where the catalog cannot stand in (the local executor,
no model.id, an id the catalog lacks) it is PRE003 with the field and the fix. Real presets, written to tmp_path
from a shipped one, through the commands a user runs."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from gdnctl.cli import app
from gdnctl.knowledge import catalog
from gdnctl.resources import presets_dir
from gdnctl.validate import validate
from tests.validate.helpers import write_checkpoint

runner = CliRunner()
CLUSTER_PATH = "/gdnctl-test-cluster/ckpt/qwen3.5-27b"  # a checkpoint directory on the cluster, not on this machine
MODEL_ID = "Qwen/Qwen3.5-27B"


def _preset(tmp_path: Path, model: dict, **changes) -> Path:
    """The shipped qwen3.5-27b-sft (2 nodes, launch.executor: slurm) with `model` and top-level `changes`."""
    data = yaml.safe_load((presets_dir() / "qwen3.5-27b-sft.yaml").read_text())
    data["model"] = model
    data.update(changes)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _validate_json(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["validate", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_a_cluster_path_with_a_catalog_id_is_checked_against_the_catalog_and_said_in_one_note(tmp_path):
    assert not Path(CLUSTER_PATH).exists()
    preset = _preset(tmp_path, {"id": MODEL_ID, "path": CLUSTER_PATH})

    exit_code, data = _validate_json(str(preset), "--strict")
    assert exit_code == 0 and data["ok"], data["findings"]
    (note,) = [f for f in data["findings"] if f["code"] == "LCH008"]
    assert note["severity"] == "info" and note["path"] == "model.path"
    assert note["message"] == (
        f"model.path {CLUSTER_PATH} is not on this machine: it will be read on the cluster, "
        f"and the catalog's architecture of {MODEL_ID} (model.id) was used for the checks."
    )
    assert note["location"].startswith(f"{preset}:")
    assert not [f for f in data["findings"] if f["code"] == "PRE003"]

    run = validate(preset).run
    assert run is not None and run.model_path_on_cluster
    assert run.model == catalog.from_catalog(MODEL_ID).model_copy(update={"path": CLUSTER_PATH})

    text = runner.invoke(app, ["validate", str(preset)])
    assert text.exit_code == 0 and "LCH008 model.path" in text.stdout and "Traceback" not in text.output
    explained = runner.invoke(app, ["explain", str(preset)])
    assert explained.exit_code == 0 and "LCH008" in explained.stdout


def test_the_rendered_job_reads_the_cluster_path_with_the_catalogs_architecture(tmp_path):
    preset = _preset(tmp_path, {"id": MODEL_ID, "path": CLUSTER_PATH})
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["render", str(preset), "-o", str(run_dir)])
    assert result.exit_code == 0, result.output
    engine = yaml.safe_load((run_dir / "engine.yaml").read_text())
    assert engine["model"] == {**catalog.from_catalog(MODEL_ID).model_dump(mode="json"), "path": CLUSTER_PATH}
    assert engine["train"]["tokenizer_path"] == CLUSTER_PATH


def test_a_missing_path_for_the_local_executor_is_pre003_with_the_fix(tmp_path):
    preset = _preset(
        tmp_path,
        {"id": MODEL_ID, "path": CLUSTER_PATH},
        cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "h100"},
        launch={"executor": "local"},
    )
    exit_code, data = _validate_json(str(preset))
    (finding,) = data["findings"]
    assert exit_code == 1 and finding["code"] == "PRE003" and finding["path"] == "model.path"
    assert finding["message"] == (
        f"model.path {CLUSTER_PATH} does not exist on this machine, so gdnctl cannot read "
        "the model's architecture from its config.json, and the local executor runs the "
        "job here."
    )
    assert finding["hint"].startswith("Point model.path at the checkpoint directory on this machine")
    assert "launch with --slurm" in finding["hint"]
    # `launch --slurm` on the same preset is the cluster case again
    assert _validate_json(str(preset), "--set", "launch.executor=slurm")[0] == 0


def test_a_missing_path_without_a_catalog_id_is_pre003_asking_for_one(tmp_path):
    exit_code, data = _validate_json(str(_preset(tmp_path, {"path": CLUSTER_PATH})))
    (finding,) = data["findings"]
    assert exit_code == 1 and finding["code"] == "PRE003" and finding["path"] == "model.path"
    assert finding["message"].endswith("and model.id is unset.")
    assert finding["hint"].startswith("Set model.id to the catalog id of the checkpoint's architecture (")
    assert MODEL_ID in finding["hint"] and "reads model.path on the cluster" in finding["hint"]


def test_a_missing_path_with_an_id_the_catalog_lacks_is_pre003_with_a_did_you_mean(tmp_path):
    exit_code, data = _validate_json(str(_preset(tmp_path, {"id": "Qwen/Qwen3.5-27b-instruct", "path": CLUSTER_PATH})))
    (finding,) = data["findings"]
    assert exit_code == 1 and finding["code"] == "PRE003" and finding["path"] == "model.path"
    assert "model.id 'Qwen/Qwen3.5-27b-instruct' is not in gdnctl's catalog." in finding["message"]
    assert "Did you mean 'Qwen/Qwen3.5-27B'?" in finding["message"]
    rendered = runner.invoke(
        app, ["render", str(_preset(tmp_path, {"path": CLUSTER_PATH})), "-o", str(tmp_path / "run")]
    )
    assert rendered.exit_code == 1 and "PRE003" in rendered.output and "Traceback" not in rendered.output
    assert not (tmp_path / "run").exists()


def test_a_path_that_is_here_is_read_even_for_slurm(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "ckpt", num_hidden_layers=12)
    run = validate(_preset(tmp_path, {"id": "Qwen/Qwen3.5-35B-A3B", "path": str(checkpoint)})).run
    assert run is not None and not run.model_path_on_cluster
    assert run.model.num_layers == 12 and run.model.path == str(checkpoint)


def test_a_directory_here_without_its_config_json_is_not_replaced_by_the_catalog(tmp_path):
    empty = tmp_path / "ckpt"
    empty.mkdir()
    exit_code, data = _validate_json(str(_preset(tmp_path, {"id": MODEL_ID, "path": str(empty)})))
    (finding,) = data["findings"]
    assert exit_code == 1 and finding["code"] == "PRE003" and finding["path"] == "model.path"
    assert f"{empty / 'config.json'} does not exist" in finding["message"]
