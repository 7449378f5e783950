"""What a save carries over from the checkpoint a run started from (runtime/model/passthrough.py): the copy of
untrained tensors byte for byte, which tensors pass through, the source's own names and config.json; and the
Megatron trainer's writer (checkpoint.save_hf) doing all of it, on CPU with a one-rank gloo group and a module
named like Megatron's, whose parameters are cut from the source by the same name rules the GPU trainer uses."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from gdnctl.knowledge.catalog import from_checkpoint
from gdnctl.runtime.model import checkpoint
from gdnctl.runtime.model.hf_weights import ShardPlace, rules_for
from gdnctl.runtime.model.passthrough import (
    PASSTHROUGH_FILE,
    HFSource,
    SourceCheckpointError,
    source_checkpoint,
    write_passthrough,
)
from tests.runtime.rl.tiny_model import DENSE, random_mtp_checkpoint, random_vision_language_checkpoint


def _header(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    return length, json.loads(raw[8 : 8 + length])


def test_the_copy_keeps_every_chosen_tensor_byte_for_byte_from_several_files(tmp_path):
    first = {
        "b": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "skip": torch.ones(4),
        "a": torch.tensor([1.5, -2.0], dtype=torch.float16),
    }
    second = {"c": torch.arange(5, dtype=torch.int64), "d": torch.randn(3, 1, 2)}
    save_file(first, str(tmp_path / "one.safetensors"))
    save_file(second, str(tmp_path / "two.safetensors"))
    chosen = {
        "b": tmp_path / "one.safetensors",
        "a": tmp_path / "one.safetensors",
        "d": tmp_path / "two.safetensors",
        "c": tmp_path / "two.safetensors",
    }

    write_passthrough(chosen, tmp_path / "out.safetensors")

    copied = load_file(str(tmp_path / "out.safetensors"))
    assert set(copied) == {"a", "b", "c", "d"}
    for name, tensor in {**first, **second}.items():
        if name in copied:
            assert copied[name].dtype == tensor.dtype and torch.equal(copied[name], tensor), name
    length, header = _header(tmp_path / "out.safetensors")
    assert length % 8 == 0  # padded like safetensors' own writer
    assert [name for name in header if name != "__metadata__"] == ["a", "b", "c", "d"]


def test_a_source_changed_since_the_run_read_it_is_refused_with_a_sentence(tmp_path):
    save_file({"w": torch.ones(1024)}, str(tmp_path / "src.safetensors"))
    with (tmp_path / "src.safetensors").open("r+b") as handle:
        handle.truncate(handle.seek(0, 2) - 100)
    with pytest.raises(SourceCheckpointError, match=r"ends inside its tensor w\. .*model\.path.*restore it"):
        write_passthrough({"w": tmp_path / "src.safetensors"}, tmp_path / "out.safetensors")
    with pytest.raises(SourceCheckpointError, match="no longer holds the tensor gone"):
        write_passthrough({"gone": tmp_path / "src.safetensors"}, tmp_path / "out.safetensors")


def test_what_passes_through_and_under_which_names():
    weight_map = {
        "model.language_model.layers.0.mlp.up_proj.weight": "a.safetensors",
        "model.language_model.embed_tokens.weight": "a.safetensors",
        "lm_head.weight": "a.safetensors",
        "model.visual.blocks.0.attn.qkv.weight": "b.safetensors",
        "mtp.fc.weight": "b.safetensors",
        "extra.unmapped.weight": "b.safetensors",
    }
    source = source_checkpoint(Path("/src"), {"model_type": "qwen3_5"}, weight_map)
    # Trained tensors keep the source's (vision-language) names; names the source lacks are left as they are.
    assert source.stored_name("model.layers.0.mlp.up_proj.weight") == "model.language_model.layers.0.mlp.up_proj.weight"
    assert source.stored_name("lm_head.weight") == "lm_head.weight"
    assert source.stored_name("model.layers.9.mlp.up_proj.weight") == "model.layers.9.mlp.up_proj.weight"
    written = ["model.language_model.layers.0.mlp.up_proj.weight", "model.language_model.embed_tokens.weight"]
    # Everything the save does not write passes through, except a tied model's stale LM head.
    assert source.passthrough(written) == {
        "extra.unmapped.weight": Path("/src/b.safetensors"),
        "model.visual.blocks.0.attn.qkv.weight": Path("/src/b.safetensors"),
        "mtp.fc.weight": Path("/src/b.safetensors"),
    }
    assert HFSource({"model_type": "qwen3_5_text"}).passthrough(written) == {}


# --- save_hf: the Megatron trainer's writer ------------------------------------------------------------------


def _megatron_names(arch) -> list[str]:
    """The parameters of the TE-free Megatron model of a dense Qwen3.5 (hf_weights' rules name them)."""
    names = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight"]
    if not arch.tie_word_embeddings:
        names.append("output_layer.weight")
    for index in range(arch.num_layers):
        layer = f"decoder.layers.{index}"
        mixer = (
            ("in_proj.weight", "conv1d.weight", "dt_bias", "A_log", "out_norm.weight", "out_proj.weight")
            if arch.layer_is_gdn(index)
            else ("linear_qkv.weight", "q_layernorm.weight", "k_layernorm.weight", "linear_proj.weight")
        )
        names += [
            f"{layer}.input_layernorm.weight",
            f"{layer}.pre_mlp_layernorm.weight",
            *(f"{layer}.self_attention.{part}" for part in mixer),
            f"{layer}.mlp.linear_fc1.weight",
            f"{layer}.mlp.linear_fc2.weight",
        ]
    return names


def _megatron_module(arch, directory: Path) -> torch.nn.Module:
    """A module named like Megatron's model, its parameters cut from the HF checkpoint by gdnctl's rules."""
    reader = checkpoint.HFReader(directory)
    names = _megatron_names(arch)
    root = torch.nn.Module()
    for name, rule in rules_for(arch, names, ShardPlace()).items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        module.register_parameter(
            leaf, torch.nn.Parameter(rule.to_local({hf_name: reader.get(hf_name) for hf_name in rule.hf_names}, 0, 1))
        )
    return root


@pytest.fixture
def gloo(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    weight_map = json.loads((directory / checkpoint.INDEX_FILE).read_text())["weight_map"]
    tensors = {}
    for file in set(weight_map.values()):
        with safe_open(str(directory / file), framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    assert set(tensors) == set(weight_map)  # the index names every tensor, in the file that holds it
    return tensors


def _save(arch, source_dir: Path, target: Path) -> checkpoint.Files:
    groups = checkpoint.Groups(tp=None, etp=None, writes_dense=True, writes_experts=True)
    return checkpoint.save_hf(
        _megatron_module(arch, source_dir), arch, ShardPlace(), groups, target, checkpoint.run_source(arch, source_dir)
    )


@pytest.mark.parametrize("make_source", [random_mtp_checkpoint, random_vision_language_checkpoint])
def test_save_hf_gives_back_the_source_checkpoint_and_a_resume_carries_it_on(gloo, tmp_path, make_source):
    source = make_source(tmp_path / "source", seed=3)
    arch = from_checkpoint(str(tmp_path / "source"), DENSE)

    written = _save(arch, tmp_path / "source", tmp_path / "iter_1")

    saved = _tensors(tmp_path / "iter_1")
    assert set(saved) == set(source)  # the source's own names: vision-language ones for the VL class
    for name, tensor in source.items():
        # bf16 Megatron parameters cut from the source and written back: every tensor, trained or carried
        # over, is the source's exactly.
        assert saved[name].dtype == tensor.dtype and torch.equal(saved[name], tensor), name
    carried = load_file(str(tmp_path / "iter_1" / PASSTHROUGH_FILE))
    assert set(carried) == {name for name in source if name.startswith(("mtp.", "model.visual."))}
    assert json.loads((tmp_path / "iter_1" / "config.json").read_text()) == json.loads(
        (tmp_path / "source" / "config.json").read_text()
    )
    # trainer_state.json records the carried-over file's size and checksum like every other file.
    carried_bytes = (tmp_path / "iter_1" / PASSTHROUGH_FILE).read_bytes()
    assert written[PASSTHROUGH_FILE] == {
        "size": len(carried_bytes),
        "sha256": hashlib.sha256(carried_bytes).hexdigest(),
    }

    # A resume loads from the saved checkpoint, which is then the source of the next save.
    _save(arch, tmp_path / "iter_1", tmp_path / "iter_2")
    for file in (PASSTHROUGH_FILE, "config.json"):
        assert (tmp_path / "iter_2" / file).read_bytes() == (tmp_path / "iter_1" / file).read_bytes()
    assert set(_tensors(tmp_path / "iter_2")) == set(source)


def test_save_hf_from_random_weights_writes_the_text_only_class_and_nothing_else(gloo, tmp_path):
    source = random_mtp_checkpoint(tmp_path / "weights", seed=4)
    arch = from_checkpoint(str(tmp_path / "weights"), DENSE)
    groups = checkpoint.Groups(tp=None, etp=None, writes_dense=True, writes_experts=True)

    checkpoint.save_hf(
        _megatron_module(arch, tmp_path / "weights"),
        arch,
        ShardPlace(),
        groups,
        tmp_path / "out",
        checkpoint.run_source(arch, None),
    )

    assert not (tmp_path / "out" / PASSTHROUGH_FILE).exists()
    assert set(_tensors(tmp_path / "out")) == {name for name in source if not name.startswith("mtp.")}
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config == checkpoint.hf_text_config(arch) and config["mtp_num_hidden_layers"] == 0
