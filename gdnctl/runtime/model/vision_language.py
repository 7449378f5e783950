"""Qwen3.5's vision-language class on CPU (transformers' `Qwen3_5ForConditionalGeneration`): built from the
architecture, its weights copied from an HF checkpoint, its names as gdnctl's writers store them. The CPU sft job
and the CPU rl policy on image prompts both train it.

In memory the class holds the language model under `model.language_model.`, the vision tower under `model.visual.`
and the LM head as `lm_head.`; gdnctl's writers take the language model under the text model's `model.` (HFSource
.stored_name puts the checkpoint's own prefix back) and the tower and head as they are.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gdnctl.errors import GdnctlError
from gdnctl.runtime.model import checkpoint, hf_weights
from gdnctl.schema import EngineConfig

VISION_PREFIX, VL_PREFIX = hf_weights.VISION_PREFIX, hf_weights.VL_PREFIX


class VisionLanguageError(GdnctlError):
    """The vision-language class cannot be built or loaded as configured."""


def vision_language_model(config: EngineConfig) -> torch.nn.Module:
    """transformers' vision-language class of the architecture, from its config (random init from train.seed)."""
    import transformers

    arch = config.model
    family = arch.family
    if arch.vision is None or family.vision_language_class is None:
        raise VisionLanguageError(
            f"{arch.label} has no vision tower; train.images needs a vision-language Qwen3.5 model "
            "(architecture Qwen3_5ForConditionalGeneration)."
        )
    model_class = getattr(transformers, family.vision_language_class)
    hf_config = checkpoint.hf_vision_language_config(arch, with_tower=True)
    config_class = model_class.config_class
    torch.manual_seed(config.train.seed)
    return model_class(config_class(**{k: v for k, v in hf_config.items() if k != "architectures"})).float()


def run_source(arch, directory: Path | None):
    """What every save of a run on images reproduces: the checkpoint it loads its weights from, or for random
    weights the vision-language class with its tower (nothing to carry over: the tower is written too)."""
    if directory is None:
        return checkpoint.vision_language_source(arch)
    return checkpoint.run_source(arch, directory)


def language_name(name: str) -> str:
    """A vision-language parameter's checkpoint name as gdnctl's writers name it: the language model's under the
    text model's `model.` (HFSource.stored_name puts them back), the tower's and the LM head's as they are."""
    return "model." + name[len(VL_PREFIX) :] if name.startswith(VL_PREFIX) else name


def load_vision_language(model: torch.nn.Module, directory: Path) -> None:
    """Copy an HF checkpoint's weights into the vision-language class: the language model by its text-model names
    (a vision-language or text-only checkpoint), the tower by its own (a checkpoint without one leaves the tower
    as initialised only when it is a text-only checkpoint)."""
    reader = checkpoint.HFReader(directory)
    tower = checkpoint.read_vision_tower(directory)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(VISION_PREFIX):
                if name not in tower:
                    raise VisionLanguageError(
                        f"{directory} has no vision tower tensor {name}; point model.path at a Qwen3.5 "
                        "vision-language checkpoint of the architecture the preset names."
                    )
                source = tower[name]
            else:
                source = reader.get(language_name(name))
            if source.shape != param.shape:
                raise VisionLanguageError(
                    f"{directory}: {name} has the shape {tuple(source.shape)}, but the model has "
                    f"{tuple(param.shape)}; the checkpoint's architecture differs from the preset's."
                )
            param.copy_(source.to(param.dtype))
