"""A random HF checkpoint of a byte-level tiny model (gdnctl/tiny-qwen3.5-bytes by default, or its MoE and
Qwen3-Next siblings), written the way the rl trainer writes its weights for the rollout: bf16 safetensors under
checkpoint names (experts one by one) and config.json, a tied LM head left out; and tiny checkpoints laid out
like Qwen's releases (random_mtp_checkpoint, random_vision_language_checkpoint): bf16 shards with an index, an
MTP layer, and for the vision-language class a vision tower."""

from __future__ import annotations

import json
from pathlib import Path

import torch

DENSE = "gdnctl/tiny-qwen3.5-bytes"


def model_classes(model_id: str = DENSE):
    """(architecture, transformers config class, transformers model class) of a catalog model."""
    from gdnctl.knowledge.catalog import from_catalog
    from gdnctl.runtime.rl.policy.torch_policy import hf_model_classes

    arch = from_catalog(model_id)
    return (arch, *hf_model_classes(arch))


def random_checkpoint(
    directory: Path, seed: int, init_std: float | None = None, model_id: str = DENSE
) -> dict[str, torch.Tensor]:
    """Write the checkpoint; returns its tensors as written. `init_std` overrides transformers' initializer
    range (larger values give the peaky logits of a trained model)."""
    from gdnctl.runtime.model.checkpoint import hf_text_config
    from gdnctl.runtime.rl.policy.torch_policy import per_expert
    from gdnctl.runtime.rl.weights.sync import write_weights

    arch, config_class, model_class = model_classes(model_id)
    config = hf_text_config(arch)
    torch.manual_seed(seed)
    init = {} if init_std is None else {"initializer_range": init_std}
    model = model_class(config_class(**config, **init))
    tied = arch.tie_word_embeddings
    tensors = (
        pair
        for name, tensor in model.state_dict().items()
        if not (tied and name == "lm_head.weight")
        for pair in per_expert(name, tensor)
    )
    return write_weights(tensors, directory, config=config)


# A vision tower small enough for CPU tests; out_hidden_size is the language model's hidden size (128).
TINY_VISION = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 128,
    "num_position_embeddings": 64,
}
# Token ids of the vision-language class's special tokens, inside the byte vocabulary (257).
TINY_VISION_TOKENS = {
    "image_token_id": 250,
    "video_token_id": 251,
    "vision_start_token_id": 252,
    "vision_end_token_id": 253,
}
# The image processor a vision-language release ships (vLLM builds the class's input processor from it).
TINY_IMAGE_PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_pixels": 1024,
    "max_pixels": 65536,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
IMAGE_PROCESSOR_FILE = "preprocessor_config.json"
FULL_ATTENTION_LAYER = "model.layers.3."  # the tiny model's one gated-attention layer


def mtp_tensors(text_tensors: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A random MTP head as Qwen3.5 releases store it (what vLLM's Qwen3_5MultiTokenPredictor loads): fc over the
    concatenated embedding and hidden state, its two pre-fc norms, one gated-attention decoder layer (shaped like
    the model's own) and a final norm."""
    hidden = text_tensors["model.norm.weight"].shape[0]
    shapes = {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.norm.weight": (hidden,),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
    }
    shapes.update(
        {
            "mtp.layers.0." + name[len(FULL_ATTENTION_LAYER) :]: tuple(tensor.shape)
            for name, tensor in text_tensors.items()
            if name.startswith(FULL_ATTENTION_LAYER)
        }
    )
    return {name: (torch.randn(shape, generator=generator) * 0.05).bfloat16() for name, shape in shapes.items()}


def _write_release(directory: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """bf16 safetensors in two shards with an index, tensors dealt alternately so that the MTP and vision tensors
    share files with the language model's (as in a release), and config.json."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    files = [f"model-0000{part}-of-00002.safetensors" for part in (1, 2)]
    weight_map = {name: files[index % 2] for index, name in enumerate(names)}
    for file in files:
        save_file(
            {name: tensors[name].contiguous() for name in names if weight_map[name] == file},
            str(directory / file),
            metadata={"format": "pt"},
        )
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def random_mtp_checkpoint(directory: Path, seed: int) -> dict[str, torch.Tensor]:
    """A text-only tiny Qwen3.5 (Qwen3_5ForCausalLM) release with an MTP layer (mtp_num_hidden_layers: 1), bf16;
    returns its tensors."""
    from gdnctl.runtime.model.checkpoint import hf_text_config

    arch, config_class, model_class = model_classes(DENSE)
    config = {**hf_text_config(arch), "mtp_num_hidden_layers": 1}
    torch.manual_seed(seed)
    model = model_class(config_class(**config))
    text = {name: tensor.bfloat16() for name, tensor in model.state_dict().items() if name != "lm_head.weight"}
    tensors = {**text, **mtp_tensors(text, torch.Generator().manual_seed(seed))}
    _write_release(directory, tensors, config)
    return tensors


def random_vision_language_checkpoint(directory: Path, seed: int) -> dict[str, torch.Tensor]:
    """A tiny Qwen3_5ForConditionalGeneration release: the language model under model.language_model., a vision
    tower (model.visual.), an MTP layer (mtp.), the VL config with text_config and vision_config, and the image
    processor's config; returns its tensors."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from gdnctl.runtime.model.checkpoint import hf_text_config

    arch, _, _ = model_classes(DENSE)
    text_config = {key: value for key, value in hf_text_config(arch).items() if key != "architectures"}
    text_config["mtp_num_hidden_layers"] = 1
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(
        Qwen3_5Config(
            text_config=text_config, vision_config=TINY_VISION, tie_word_embeddings=True, **TINY_VISION_TOKENS
        )
    )
    state = {name: tensor.bfloat16() for name, tensor in model.state_dict().items() if name != "lm_head.weight"}
    text = {
        "model." + name[len("model.language_model.") :]: tensor
        for name, tensor in state.items()
        if name.startswith("model.language_model.")
    }
    tensors = {**state, **mtp_tensors(text, torch.Generator().manual_seed(seed))}
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_config,
        "vision_config": {**TINY_VISION, "model_type": "qwen3_5_vision"},
        "tie_word_embeddings": True,
        **TINY_VISION_TOKENS,
        "torch_dtype": "bfloat16",
    }
    _write_release(directory, tensors, config)
    (directory / IMAGE_PROCESSOR_FILE).write_text(json.dumps(TINY_IMAGE_PROCESSOR, indent=2))
    return tensors


def checkpoint_tensors(directory: Path) -> dict:
    """Every tensor of a saved checkpoint by its stored name, through its index (which must list them all)."""
    import json

    from safetensors import safe_open

    weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = {}
    for file in set(weight_map.values()):
        with safe_open(str(directory / file), framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    assert set(tensors) == set(weight_map)
    return tensors


VL_BYTES = "gdnctl/tiny-qwen3.5-vl-bytes"


def random_vision_rollout_checkpoint(directory: Path, seed: int, tower_seed: int, init_std: float | None = None):
    """gdnctl/tiny-qwen3.5-vl-bytes with random weights, its language model from `seed` and its vision tower from
    `tower_seed`, written as the rl trainer writes a rollout's weights on image prompts: bf16 under the
    vision-language class's names (a tied LM head left out), its config.json with the tower, and the files vLLM
    builds its input processor from. Returns the fp32 model (transformers' Qwen3_5ForConditionalGeneration) and the
    tensors as written."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from gdnctl.knowledge.catalog import from_catalog
    from gdnctl.runtime.data.pipeline import load_tokenizer
    from gdnctl.runtime.model.checkpoint import hf_vision_language_config
    from gdnctl.runtime.rl.weights import processor_files
    from gdnctl.runtime.rl.weights.sync import write_weights

    arch = from_catalog(VL_BYTES)
    config = hf_vision_language_config(arch, with_tower=True)
    settings = {key: value for key, value in config.items() if key not in ("architectures", "model_type")}
    if init_std is not None:
        settings["text_config"] = {**settings["text_config"], "initializer_range": init_std}
        settings["vision_config"] = {**settings["vision_config"], "initializer_range": init_std}
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(**settings)).eval()
    torch.manual_seed(tower_seed)
    other = Qwen3_5ForConditionalGeneration(Qwen3_5Config(**settings))
    model.model.visual.load_state_dict(other.model.visual.state_dict())
    tokenizer = load_tokenizer(Path(__file__).parents[3] / "examples" / "toy-rl" / "tokenizer")
    written = write_weights(
        ((name, tensor) for name, tensor in model.state_dict().items() if name != "lm_head.weight"),
        directory,
        config=config,
        files=processor_files.processor_files(tokenizer, arch.vision),
    )
    # The trainer's fp32 copy holds the bf16 weights the engine serves.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.bfloat16().float())
    return model, written
