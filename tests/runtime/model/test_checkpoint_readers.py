"""The checkpoint readers (gdnctl/runtime/model/checkpoint.py, with hf_weights.py's conversion) on files that break
them: every failure is a CheckpointError naming the file, never a raw SafetensorError, ValueError, KeyError,
TypeError, RecursionError, EOFError or a tensor's RuntimeError."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.model.checkpoint import CheckpointError
from gdnctl.runtime.model.hf_weights import ShardPlace, rules_for
from tests.runtime.model.test_hf_weights import NEXT, TINY, megatron_names, random_hf


def _single_file_checkpoint(directory: Path, tensors: dict[str, torch.Tensor]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForCausalLM"]}))
    return directory


@pytest.mark.parametrize(
    ("index", "said"),
    [
        ("[" * 100_000, "nests its JSON deeper than a reader can follow"),
        ("{", "is not valid JSON"),
        (json.dumps([1]), "has no weight_map"),
        (json.dumps({"weight_map": ["model.safetensors"]}), "has no weight_map"),
        (json.dumps({"weight_map": {"model.norm.weight": 3}}), "has no weight_map"),
        (json.dumps({"weight_map": {"model.norm.weight": "../../etc/passwd"}}), "has no weight_map"),
    ],
)
def test_an_index_no_reader_can_take_is_named(tmp_path, index, said):
    (tmp_path / checkpoint.INDEX_FILE).write_text(index)
    with pytest.raises(CheckpointError, match=said) as raised:
        checkpoint.HFReader(tmp_path)
    assert str(tmp_path / checkpoint.INDEX_FILE) in str(raised.value)


@pytest.mark.parametrize("damage", ["empty", "garbage", "truncated"])
def test_a_safetensors_file_that_does_not_read_is_named(tmp_path, damage):
    directory = _single_file_checkpoint(tmp_path / "ckpt", {"model.norm.weight": torch.ones(8)})
    weights = directory / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes({"empty": b"", "garbage": os.urandom(64), "truncated": whole[:-8]}[damage])
    with pytest.raises(CheckpointError, match=f"{weights} cannot be read as safetensors"):
        checkpoint.HFReader(directory)


def test_a_shard_file_missing_or_damaged_behind_the_index_is_named(tmp_path):
    (tmp_path / checkpoint.INDEX_FILE).write_text(
        json.dumps({"weight_map": {"model.norm.weight": "gone.safetensors", "lm_head.weight": "bad.safetensors"}})
    )
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 16)
    reader = checkpoint.HFReader(tmp_path)
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'gone.safetensors'} cannot give tensor model.norm.weight"):
        reader.get("model.norm.weight")
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'bad.safetensors'} cannot give tensor lm_head.weight"):
        reader.get("lm_head.weight")


@pytest.mark.parametrize(("config", "said"), [("[1]", "is not a JSON object"), ("{", "is not valid JSON")])
def test_a_source_config_that_does_not_read_is_named(tmp_path, config, said):
    directory = _single_file_checkpoint(tmp_path / "ckpt", {"model.norm.weight": torch.ones(8)})
    (directory / "config.json").write_text(config)
    with pytest.raises(CheckpointError, match=said):
        checkpoint.run_source(TINY, directory)
    os.unlink(directory / "config.json")
    os.mkfifo(directory / "config.json")
    with pytest.raises(CheckpointError, match="is a named pipe"):
        checkpoint.run_source(TINY, directory)


def _module(shapes: dict[str, tuple[int, ...]]) -> torch.nn.Module:
    """A module whose parameters carry Megatron's dotted names, as the built model's do."""
    root = torch.nn.Module()
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape)))
    return root


def test_a_tensor_the_conversion_cannot_cut_is_named_with_its_shape(tmp_path):
    hf = random_hf(NEXT)
    names = megatron_names(NEXT)
    rules = rules_for(NEXT, names, ShardPlace())
    model = _module(
        {
            name: tuple(rules[name].to_local(hf, 0, 1).shape)
            for name in names
            if not (NEXT.tie_word_embeddings and name == "output_layer.weight")
        }
    )
    qkvz = "model.layers.0.linear_attn.in_proj_qkvz.weight"
    hf[qkvz] = hf[qkvz][:-3]  # three rows short: Qwen3-Next's per-key-head regrouping cannot view it
    directory = _single_file_checkpoint(tmp_path / "ckpt", hf)
    with pytest.raises(
        CheckpointError,
        match=rf"{directory}: .*{qkvz} \(\d+, \d+\).* cannot make "
        r"decoder\.layers\.0\.self_attention\.in_proj\.weight",
    ):
        checkpoint.load_hf(model, NEXT, ShardPlace(), directory)


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ("[1]", "is not a JSON object"),
        ("{", "is not valid JSON"),
        (json.dumps({"world_size": 1}), "has iteration None, not a count"),
        (json.dumps({"iteration": "3", "world_size": 1}), "has iteration '3', not a count"),
        (json.dumps({"iteration": True, "world_size": 1}), "has iteration True, not a count"),
        (json.dumps({"iteration": 3, "consumed_samples": -1, "world_size": 1}), "has consumed_samples -1"),
    ],
)
def test_a_trainer_state_that_does_not_read_is_named(tmp_path, state, said):
    (tmp_path / checkpoint.STATE_FILE).write_text(state)
    with pytest.raises(CheckpointError, match=said) as raised:
        checkpoint.read_training_state(tmp_path, 1)
    assert str(tmp_path / checkpoint.STATE_FILE) in str(raised.value)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", "cannot be loaded"),
        (b"not a torch archive", "cannot be loaded"),
        ("list of numbers", "holds no optimizer states of gdnctl's"),
        ("wrong layout", "does not fit this run's optimizer"),
    ],
)
def test_an_optimizer_state_that_does_not_load_is_named(tmp_path, one_rank_group, content, said):
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    path = tmp_path / "ckpt" / "optimizer" / "rank-00000.pt"
    path.parent.mkdir(parents=True)
    if content == "list of numbers":
        torch.save([1, 2], path)
    elif content == "wrong layout":
        other = torch.optim.AdamW(torch.nn.Linear(4, 4).parameters())
        state = other.state_dict()
        state["param_groups"][0]["params"] = [0, 1, 2]
        torch.save([{"state_dict": state}], path)
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=said) as raised:
        checkpoint.load_training_state(tmp_path / "ckpt", optimizer, device="cpu")
    assert str(path) in str(raised.value)
