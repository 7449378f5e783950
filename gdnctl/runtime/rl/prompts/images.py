"""An rl prompt with images, as both sides of the rollout take it: the trainer's token ids with every image's tokens
in place and its patches, and vLLM's token prompt with the images as multi-modal data.

vLLM (0.32.0) expands a token prompt's images itself: its Qwen3-VL processor (Qwen3.5's, vllm/model_executor/models/
qwen3_vl.py `_get_prompt_updates`) replaces the n-th `image_token_id` of the prompt with as many image tokens as the
n-th image's grid holds (grid t x h x w / spatial_merge_size^2), between the prompt's own `vision_start` and
`vision_end`. So the engine gets each image as `vision_start, image_token_id, vision_end` (`engine_ids`) and the
trainer the same with the image token repeated (`token_ids`, as runtime/data/images.py writes an sft record); both
count the tokens from the same grid. Both also cut the same pixels: every image is resized here, once, to the size
Qwen's image processor would resize it to (smart_resize, bicubic, as the PIL processor does), so neither processor
resizes again (transformers' PIL one for the trainer, the torch one in vLLM's environment) and their patches agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gdnctl.knowledge import VisionArch
from gdnctl.runtime.data import images as image_records
from gdnctl.schema import image_data

# One image on the rollout's wire: width, height and its RGB pixels, row by row (PIL's "RGB" raw bytes).
WireImage = tuple[int, int, bytes]
# The logit bias that keeps a response off the vision tokens: vLLM's floor (vllm/sampling_params.py clamps a bias
# to [-100, 100]), which the engine adds before its temperature and the trainer adds likewise (response_bias).
BANNED_BIAS = -100.0


@dataclass(frozen=True)
class ImagePrompt:
    token_ids: list[int]  # the trainer's: each image's tokens expanded
    images: tuple[WireImage, ...]  # what vLLM gets as the prompt's multi-modal data
    pixel_values: torch.Tensor  # float32 [patches, channels x temporal x patch x patch]
    image_grid_thw: torch.Tensor  # int64 [images, 3]


def engine_ids(token_ids: list[int], image_token_id: int) -> list[int]:
    """vLLM's token prompt for the trainer's ids: every run of image tokens as one, which vLLM expands again."""
    return [
        token
        for index, token in enumerate(token_ids)
        if not (token == image_token_id and index and token_ids[index - 1] == image_token_id)
    ]


def response_bias(vision: VisionArch) -> dict[int, float]:
    """The logit bias of every vision token, for the responses of an image job. The vision-language class takes
    every image token of a row as an image's slot (transformers' get_placeholder_mask; vLLM's processor of a
    continued prompt alike), so a response that sampled one would no longer match its images: neither side may
    sample them, and both score the responses under the same biased distribution."""
    tokens = (vision.vision_start_token_id, vision.vision_end_token_id, vision.image_token_id, vision.video_token_id)
    return dict.fromkeys(tokens, BANNED_BIAS)


def token_types(token_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """mm_token_type_ids for transformers' vision-language class: 1 on image tokens, 0 elsewhere."""
    return (token_ids == image_token_id).long()


class ImagePrompts:
    """Encodes rl records with images for a model's vision tower (its VisionArch) within train.images' limits."""

    def __init__(self, vision: VisionArch, limits: image_data.ImageLimits) -> None:
        self.vision = vision
        self.limits = limits
        self.processor = image_records.image_processor(vision)

    def encode(self, prompt: str, images: object, encode, where: str, base_dir: Path) -> ImagePrompt:
        """The prompt (one `<image>` where each image goes, as an sft record's) and its images; `encode` is the
        tokenizer's text -> ids. ImageDataError naming the record where an image is missing, unreadable or too
        large."""
        sample = image_data.image_sample({"prompt": prompt, "response": "", "images": images}, where)
        if len(sample.images) > self.limits.max_per_sample:
            raise image_data.ImageDataError(
                f"{where} holds {len(sample.images)} images, more than train.images.max_per_sample "
                f"({self.limits.max_per_sample})"
            )
        pictures = [self._resized(image_records.read_picture(image, base_dir, self.limits)) for image in sample.images]
        processed = self.processor(images=pictures, return_tensors="pt")
        grids = processed["image_grid_thw"].to(torch.int64)
        ids, _ = image_records.prompt_ids(sample, grids, self.vision, encode)
        return ImagePrompt(
            token_ids=ids,
            images=tuple((picture.width, picture.height, picture.tobytes()) for picture in pictures),
            pixel_values=processed["pixel_values"].to(torch.float32),
            image_grid_thw=grids,
        )

    def _resized(self, picture):
        """The picture at the size Qwen's image processor resizes it to, so that no processor resizes it again."""
        from PIL import Image
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        vision = self.vision
        height, width = smart_resize(
            picture.height,
            picture.width,
            factor=vision.patch_size * vision.spatial_merge_size,
            min_pixels=vision.min_pixels,
            max_pixels=vision.max_pixels,
        )
        if (width, height) == picture.size:
            return picture
        return picture.resize((width, height), Image.Resampling.BICUBIC)


def probe_prefix(prompt: ImagePrompt, tokens: int, vision: VisionArch) -> ImagePrompt:
    """The prompt's first `tokens` tokens, or more: at least through its first image, and never ending inside an
    image's tokens (vLLM expands a prompt's images whole). The weight-sync probe scores this prefix, so that a
    wrong vision tower in the engine moves it. Only the images inside the cut stay, with their patches."""
    ids = prompt.token_ids
    ends = [index + 1 for index, token in enumerate(ids) if token == vision.vision_end_token_id]
    stop = max(tokens, ends[0]) if ends else tokens
    starts = [index for index, token in enumerate(ids) if token == vision.vision_start_token_id]
    for start, end in zip(starts, ends, strict=True):
        if start < stop < end:
            stop = end
    kept = sum(end <= stop for end in ends)
    grids = prompt.image_grid_thw[:kept]
    patches = int(grids.prod(dim=1).sum()) if kept else 0
    return ImagePrompt(
        token_ids=ids[:stop],
        images=prompt.images[:kept],
        pixel_values=prompt.pixel_values[:patches],
        image_grid_thw=grids,
    )
