"""Records with images (schema/image_data.py) as the vision-language model's inputs: token ids with each image's
tokens in place, its pixels as the image processor cuts them, and which positions train.

An image becomes `vision_start`, one `image_token_id` per merged block of patches, `vision_end`, as Qwen's
processor writes it (transformers' Qwen3VLProcessor); the patches come from transformers' PIL image processor for
Qwen-VL (Qwen2VLImageProcessorPil, what Qwen3.5 checkpoints name), built from the model's VisionArch: its sizes
and pixel bounds come from the checkpoint's preprocessor_config.json or, for random weights, the catalog
(knowledge/catalog.py), so nothing is downloaded. The prompt, its image tokens included, takes no loss; the
response and the EOS train. Every image is read and checked here, at the job's start, before step 1: a missing,
unreadable or oversized one stops the job with its file and line.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import torch

from gdnctl.files import UnreadableFile, read_jsonl
from gdnctl.knowledge import VisionArch
from gdnctl.runtime.data.pipeline import DataError, LocalTokenizer
from gdnctl.schema import image_data

# mm_token_type_ids' values (transformers' get_rope_index): text 0, image 1.
TEXT_TYPE, IMAGE_TYPE = 0, 1


@dataclass(frozen=True)
class ImageDocument:
    """One sample: token ids, which of them train, their modality, and its images' patches (none for a text-only
    record)."""

    token_ids: torch.Tensor  # int64 [n]
    trained: torch.Tensor  # bool [n]: whether the model is trained to predict the token
    token_types: torch.Tensor  # int64 [n]: TEXT_TYPE or IMAGE_TYPE
    pixel_values: torch.Tensor | None  # float32 [patches, channels x temporal x patch x patch]
    image_grid_thw: torch.Tensor | None  # int64 [images, 3]: frames, patch rows, patch columns

    def __len__(self) -> int:
        return self.token_ids.numel()

    @property
    def image_tokens(self) -> int:
        return int((self.token_types == IMAGE_TYPE).sum())


def image_processor(vision: VisionArch):
    """transformers' Qwen-VL image processor (PIL, no torchvision) with the model's patch sizes and pixel bounds."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    settings = vision.preprocessor_config()
    settings.pop("image_processor_type")
    return Qwen2VLImageProcessorPil(**settings)


def read_picture(image: image_data.ImageRef, base_dir: Path, limits: image_data.ImageLimits):
    """The image as an RGB PIL picture, within `limits`; ImageDataError naming where it is, when it cannot be
    read or decoded."""
    from PIL import Image, UnidentifiedImageError

    data, _ = image.read(base_dir, limits)
    try:
        with Image.open(io.BytesIO(data)) as opened:
            return opened.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise image_data.ImageDataError(f"{image.where}: {image.label} cannot be decoded ({error})") from None


def prompt_ids(
    sample: image_data.ImageSample, grids: torch.Tensor, vision: VisionArch, encode
) -> tuple[list[int], list[int]]:
    """The prompt's token ids and their modality: each text piece through `encode` (text -> ids), each image as
    `vision_start`, one image token per merged block of its grid's patches, `vision_end`."""
    merge = vision.spatial_merge_size**2
    ids: list[int] = []
    types: list[int] = []
    image = 0
    for piece in sample.prompt:
        if isinstance(piece, image_data.ImageRef):
            count = int(grids[image].prod()) // merge
            image += 1
            ids += [vision.vision_start_token_id, *[vision.image_token_id] * count, vision.vision_end_token_id]
            types += [TEXT_TYPE, *[IMAGE_TYPE] * count, TEXT_TYPE]
        else:
            piece_ids = encode(piece)
            ids += piece_ids
            types += [TEXT_TYPE] * len(piece_ids)
    return ids, types


class ImageDocuments:
    """Reads a jsonl dataset of records with images (and plain prompt/response records beside them)."""

    def __init__(
        self, vision: VisionArch, tokenizer: LocalTokenizer, limits: image_data.ImageLimits, seq_length: int
    ) -> None:
        self.vision = vision
        self.tokenizer = tokenizer
        self.limits = limits
        self.seq_length = seq_length
        self.processor = image_processor(vision)

    def read(self, path: str | Path) -> list[ImageDocument]:
        path = Path(path)
        documents = []
        try:
            for number, record in read_jsonl(path, image_data.MAX_IMAGE_RECORD_BYTES):
                documents.append(self.document(record, f"{path} line {number}", path.parent))
        except UnreadableFile as error:
            raise DataError(f"{error}; point train.data_path at a jsonl of records (docs/images.md).") from None
        if not documents:
            raise DataError(f"{path} holds no records; point train.data_path at a jsonl of records (docs/images.md).")
        return documents

    def document(self, record: object, where: str, base_dir: Path) -> ImageDocument:
        if not image_data.has_images(record):
            return self._text_document(record, where)
        try:
            sample = image_data.image_sample(record, where)
            if len(sample.images) > self.limits.max_per_sample:
                raise image_data.ImageDataError(
                    f"{where} holds {len(sample.images)} images, more than train.images.max_per_sample "
                    f"({self.limits.max_per_sample})"
                )
            pictures = [read_picture(image, base_dir, self.limits) for image in sample.images]
        except image_data.ImageDataError as error:
            raise DataError(f"{error}; fix the record or raise the limit in train.images (docs/images.md).") from None
        processed = self.processor(images=pictures, return_tensors="pt")
        grids = processed["image_grid_thw"]
        ids, types = prompt_ids(sample, grids, self.vision, self.tokenizer.encode)
        response = self.tokenizer.with_eos(self.tokenizer.encode(sample.response))
        return self._checked(
            ids, response, types, where, processed["pixel_values"].to(torch.float32), grids.to(torch.int64)
        )

    def _text_document(self, record: object, where: str) -> ImageDocument:
        if not (
            isinstance(record, dict)
            and isinstance(record.get("prompt"), str)
            and isinstance(record.get("response"), str)
        ):
            raise DataError(
                f'{where} is neither a record with images nor a {{"prompt": ..., "response": ...}} record; '
                "an image job's dataset holds these two forms (docs/images.md)."
            )
        prompt = self.tokenizer.encode(record["prompt"])
        response = self.tokenizer.with_eos(self.tokenizer.encode(record["response"]))
        return self._checked(prompt, response, [TEXT_TYPE] * len(prompt), where, None, None)

    def _checked(self, prompt, response, types, where, pixels, grids) -> ImageDocument:
        ids = [*prompt, *response]
        if len(ids) > self.seq_length:
            raise DataError(
                f"{where} is {len(ids)} tokens with its image tokens, longer than train.seq_length "
                f"({self.seq_length}); raise train.seq_length or shorten the record (an image is never cut)."
            )
        if not response:
            raise DataError(f"{where} has an empty response and no EOS to train; give it a response.")
        return ImageDocument(
            token_ids=torch.tensor(ids, dtype=torch.int64),
            trained=torch.tensor([False] * len(prompt) + [True] * len(response)),
            token_types=torch.tensor([*types, *[TEXT_TYPE] * len(response)], dtype=torch.int64),
            pixel_values=pixels,
            image_grid_thw=grids,
        )


@dataclass(frozen=True)
class ImageBatch:
    """Padded rows of documents for the vision-language class: inputs, their labels (IGNORE_INDEX where nothing
    trains), and the patches of every image in the rows, in row order."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    labels: torch.Tensor  # [B, T]: the next token where it trains, else IGNORE_INDEX
    mm_token_type_ids: torch.Tensor  # [B, T]
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None

    @property
    def trained_tokens(self) -> int:
        from gdnctl.runtime.data.layout import IGNORE_INDEX

        return int((self.labels != IGNORE_INDEX).sum())

    def model_inputs(self) -> dict:
        inputs = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "mm_token_type_ids": self.mm_token_type_ids,
        }
        if self.pixel_values is not None:
            inputs.update(pixel_values=self.pixel_values, image_grid_thw=self.image_grid_thw)
        return inputs


def image_batch(documents: list[ImageDocument], pad_id: int) -> ImageBatch:
    """Right-padded rows of `documents`; a label is the next token where that token trains."""
    from gdnctl.runtime.data.layout import IGNORE_INDEX

    width = max(len(document) for document in documents)
    shape = (len(documents), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.int64)
    attention_mask = torch.zeros(shape, dtype=torch.int64)
    labels = torch.full(shape, IGNORE_INDEX, dtype=torch.int64)
    types = torch.zeros(shape, dtype=torch.int64)
    for row, document in enumerate(documents):
        n = len(document)
        input_ids[row, :n] = document.token_ids
        attention_mask[row, :n] = 1
        types[row, :n] = document.token_types
        # Position t predicts token t + 1 (transformers shifts nothing when labels come pre-aligned like this).
        labels[row, : n - 1] = torch.where(document.trained[1:], document.token_ids[1:], IGNORE_INDEX)
    with_images = [document for document in documents if document.pixel_values is not None]
    return ImageBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        labels=labels,
        mm_token_type_ids=types,
        pixel_values=torch.cat([d.pixel_values for d in with_images]) if with_images else None,
        image_grid_thw=torch.cat([d.image_grid_thw for d in with_images]) if with_images else None,
    )
