"""The rl job's policy on device cpu for image prompts (train.images): transformers' Qwen3.5 vision-language class
(`Qwen3_5ForConditionalGeneration`, runtime/model/vision_language.py), trained as TorchPolicy trains the text class.

Rows are padded (BSHD), as in the CPU sft job: the class computes its multimodal rotary positions per row from the
attention mask. A batch's images are every image row's patches in row order (algorithm/batch.py), and the image
tokens are marked for the class by `mm_token_type_ids`. Responses never hold a vision token: the engine's sampling
and the trainer's log-probs both add prompts/images.py's response_bias to them.

train.vision: frozen leaves the tower as loaded (no gradient, no optimizer state); train trains it. Either way the
rollout gets the tower with every sync (vLLM serves it for the image prompts, and a directory sync replaces the
whole set) and checks it by checksum; saves write a frozen tower only when there is no source to carry it from,
as the sft job does. The weights directory also holds the tokenizer and image processor files vLLM's multi-modal
processor is built from (weights/processor_files.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from gdnctl.knowledge import PREPROCESSOR_FILE
from gdnctl.runtime.data import load_tokenizer
from gdnctl.runtime.model import durable_files, vision_language
from gdnctl.runtime.rl.policy.torch_policy import TorchPolicy, per_expert
from gdnctl.runtime.rl.prompts import response_bias, token_types
from gdnctl.runtime.rl.weights import processor_files
from gdnctl.schema import EngineConfig


class TorchVisionPolicy(TorchPolicy):
    def __init__(self, config: EngineConfig, device: str = "cpu") -> None:
        self.vision = config.model.vision
        self.train_tower = config.train.vision == "train"
        # A trained tower leaves the tower without gradient on a micro-batch of text rows.
        self.unused_parameters = self.train_tower
        super().__init__(config, device)
        # A frozen tower is carried over from the source; with none to carry from, it is written.
        self.writes_tower = self.train_tower or not self.source.has_vision_tower
        banned = response_bias(self.vision)
        self.bias = torch.zeros(self.module.config.text_config.vocab_size)
        self.bias[list(banned)] = torch.tensor(list(banned.values()))
        self.rollout_files = processor_files.processor_files(load_tokenizer(config.train.tokenizer_path), self.vision)
        self.preprocessor_config = self.vision.preprocessor_config()

    def _new_model(self, config: EngineConfig) -> torch.nn.Module:
        model = vision_language.vision_language_model(config)
        model.model.visual.requires_grad_(self.train_tower)
        return model

    def _load_weights(self, model: torch.nn.Module, directory: Path) -> None:
        vision_language.load_vision_language(model, directory)

    def _save_source(self, config: EngineConfig, directory: Path | None):
        return vision_language.run_source(config.model, directory)

    def _forward(self, model: torch.nn.Module, tokens: torch.Tensor, attention_mask, images) -> torch.Tensor:
        inputs = {"input_ids": tokens, "mm_token_type_ids": token_types(tokens, self.vision.image_token_id)}
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask
        if images is not None:
            inputs.update(pixel_values=images.pixel_values, image_grid_thw=images.image_grid_thw)
        return model(**inputs).logits

    def _sampled_logits(self, logits: torch.Tensor) -> torch.Tensor:
        # The engine adds the same bias to its fp32 logits before its temperature (vllm_engine.py).
        return logits + self.bias.to(logits.device)

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.module.state_dict().items():
            if self.tied and name == "lm_head.weight":
                continue
            yield from per_expert(vision_language.language_name(name), tensor)

    def _rollout_files(self) -> dict[str, str]:
        return self.rollout_files

    def _saved_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.hf_tensors():
            if self.writes_tower or not name.startswith(vision_language.VISION_PREFIX):
                yield name, tensor

    def _save_extras(self, directory: Path) -> dict:
        # The image processor the run used, so that the checkpoint as model.path cuts images the same way.
        return {PREPROCESSOR_FILE: durable_files.write_json(directory / PREPROCESSOR_FILE, self.preprocessor_config)}
