"""Reading presets: base inheritance, --set overrides, schema errors with positions, unreadable input."""

from __future__ import annotations

import pytest

from gdnctl.errors import PresetLoadError
from gdnctl.validate.loader import load_preset, parse_override
from gdnctl.validate.pipeline import validate


def write(path, text):
    path.write_text(text)
    return path


def test_base_relative_to_file_and_deep_merge(tmp_path):
    write(
        tmp_path / "parent.yaml",
        "name: p\njob: sft\nmodel: {id: Qwen/Qwen3.5-9B}\nparallel: {tp: 2, pp: 1}\ntrain: {seq_length: 4096}\n",
    )
    child = write(tmp_path / "child.yaml", "base: parent.yaml\nname: c\nparallel: {pp: 2}\n")
    loaded = load_preset(child)
    assert loaded.preset.name == "c"
    assert (loaded.preset.parallel.tp, loaded.preset.parallel.pp) == (2, 2)
    assert loaded.preset.train.seq_length == 4096
    assert loaded.chain == [str(tmp_path / "parent.yaml"), str(child)]


def test_base_names_a_shipped_preset(tmp_path):
    child = write(tmp_path / "mine.yaml", "base: qwen3.5-35b-a3b-grpo\nname: mine\ntrain: {global_batch_size: 256}\n")
    preset = load_preset(child).preset
    assert preset.model.id == "Qwen/Qwen3.5-35B-A3B" and preset.train.global_batch_size == 256


def test_base_cycle_is_a_load_error(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\nname: a\n")
    write(tmp_path / "b.yaml", "base: a.yaml\nname: b\n")
    with pytest.raises(PresetLoadError, match="cycle"):
        load_preset(tmp_path / "a.yaml")


def test_missing_base(tmp_path):
    write(tmp_path / "a.yaml", "base: nowhere.yaml\nname: a\n")
    with pytest.raises(PresetLoadError, match="nowhere.yaml"):
        load_preset(tmp_path / "a.yaml")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("parallel.tp=2", 2),
        ("train.lr=1e-5", 1e-5),
        ("parallel.sequence_parallel=false", False),
        ("parallel.vpp=null", None),
        ("comm.skip_ops=[barrier, isend]", ["barrier", "isend"]),
        ("launch.env={A: '1'}", {"A": "1"}),
        ("name=my run", "my run"),
    ],
)
def test_override_values_parse_as_yaml(text, expected):
    assert parse_override(text)[1] == expected


def test_overrides_apply_and_are_located():
    result = validate("qwen3.5-35b-a3b-grpo", ["parallel.tp=3", "parallel.ep=2"])
    head = [f for f in result.findings if f.code == "HEAD002"]
    assert head and head[0].location == "--set"


@pytest.mark.parametrize("bad", ["parallel.tp", "=3", "a..b=1", "parallel.tp.x=1"])
def test_malformed_override(bad):
    with pytest.raises(PresetLoadError):
        validate("qwen3.5-35b-a3b-grpo", [bad])


def test_unknown_key_did_you_mean_with_line(tmp_path):
    path = write(tmp_path / "p.yaml", "name: p\njob: sft\nmodel: {id: Qwen/Qwen3.5-9B}\ntrain:\n  micro_batchsize: 2\n")
    result = validate(path)
    (finding,) = result.findings
    assert finding.code == "PRE001" and finding.path == "train.micro_batchsize"
    assert "Did you mean 'micro_batch_size'?" in finding.hint
    assert finding.location == f"{path}:5:3"


def test_wrong_type_and_missing_field(tmp_path):
    path = write(tmp_path / "p.yaml", "name: p\nmodel: {id: Qwen/Qwen3.5-9B}\nparallel: {tp: two}\n")
    found = {(f.code, f.path) for f in validate(path).findings}
    assert found == {("PRE002", "job"), ("PRE002", "parallel.tp")}


def test_unknown_model_did_you_mean(tmp_path):
    path = write(tmp_path / "p.yaml", "name: p\njob: sft\nmodel: {id: Qwen/Qwen3.5-35B-A3}\n")
    (finding,) = validate(path).findings
    assert finding.code == "PRE003" and "Did you mean 'Qwen/Qwen3.5-35B-A3B'" in finding.message


def test_checkpoint_config_wins_over_catalog(tmp_path):
    from tests.validate.helpers import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "ckpt", num_hidden_layers=12)
    path = write(
        tmp_path / "p.yaml",
        f"name: p\njob: sft\nmodel: {{id: Qwen/Qwen3.5-35B-A3B, path: '{ckpt}'}}\ncluster: {{gpus_per_node: 1}}\n",
    )
    result = validate(path)
    assert result.run.model.num_layers == 12 and result.run.model.hidden_size == 256


def test_missing_checkpoint_config(tmp_path):
    path = write(tmp_path / "p.yaml", f"name: p\njob: sft\nmodel: {{path: '{tmp_path}/none'}}\n")
    (finding,) = validate(path).findings
    assert finding.code == "PRE003" and finding.path == "model.path"


@pytest.mark.parametrize(
    "text,match",
    [
        ("name: x\njob: [\n", r"p.yaml:3:1"),
        ("", "empty"),
        ("- a\n- b\n", "mapping"),
        ("name: a\nname: b\n", "appears twice"),
    ],
)
def test_unreadable_yaml(tmp_path, text, match):
    with pytest.raises(PresetLoadError, match=match):
        load_preset(write(tmp_path / "p.yaml", text))


def test_a_number_in_launch_env_is_written_as_yaml_spelled_it(tmp_path):
    path = write(
        tmp_path / "p.yaml",
        "base: tiny-qwen3.5-sft\nname: p\nlaunch:\n  env:\n"
        "    CUDA_DEVICE_MAX_CONNECTIONS: 1\n    NCCL_TIMEOUT_SCALE: 1.5\n",
    )
    result = validate(path)
    assert not [f for f in result.findings if f.code.startswith("PRE")]
    assert result.run.preset.launch.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_TIMEOUT_SCALE": "1.5"}


def test_true_in_launch_env_is_refused_with_the_quote_to_write():
    result = validate("tiny-qwen3.5-sft", ["launch.env.TORCHDYNAMO_DISABLE=true"])
    (finding,) = [f for f in result.findings if f.code == "PRE002"]
    assert finding.path == "launch.env"
    assert "TORCHDYNAMO_DISABLE is true" in finding.message and "quote it" in finding.message


def test_override_key_parts_are_stripped():
    """`--set 'parallel.tp = 2'`: the key is parallel.tp, not 'tp ' (which PRE001 would call unknown)."""
    assert parse_override("parallel.tp = 2") == (("parallel", "tp"), 2)
    assert parse_override(" train . lr=1e-3")[0] == ("train", "lr")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("train.x=[1, 2", "opens a YAML flow list with '[' that is not closed"),
        ("train.x={a: 1", "opens a YAML flow mapping with '{' that is not closed"),
        ("train.x=a: b: c", "is not valid YAML (mapping values are not allowed here)"),
    ],
)
def test_an_unparsable_override_says_why_and_both_ways_out(text, said):
    with pytest.raises(PresetLoadError) as caught:
        parse_override(text)
    message = str(caught.value)
    assert said in message and "put YAML quotes inside the shell's: --set \"train.x='" in message
    # The quoted form the message suggests parses, as the text the user typed.
    suggested = message.split('--set "', 1)[1].rsplit('"', 1)[0]
    assert parse_override(suggested) == (("train", "x"), text.partition("=")[2])


def test_a_mistyped_shipped_preset_name_gets_a_did_you_mean():
    with pytest.raises(PresetLoadError, match=r"Did you mean tiny-qwen3\.5-sft\b"):
        load_preset("tiny-qwen3.5-sf")
    with pytest.raises(PresetLoadError, match="no such file") as caught:
        load_preset("./nowhere/at-all.yaml")
    assert "Did you mean" not in str(caught.value)
