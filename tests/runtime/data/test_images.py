"""Records with images as the vision-language class's inputs (runtime/data/images.py), on the tiny VL model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from gdnctl.knowledge import catalog
from gdnctl.runtime.data import IGNORE_INDEX, images, load_tokenizer
from gdnctl.runtime.data.pipeline import DataError
from gdnctl.schema import image_data

REPO = Path(__file__).resolve().parents[3]
TINY_VL = "gdnctl/tiny-qwen3.5-vl-bytes"
LIMITS = image_data.ImageLimits(max_per_sample=2, max_bytes=1 << 20, max_pixels=1 << 20)


@pytest.fixture
def reader():
    arch = catalog.from_catalog(TINY_VL)
    tokenizer = load_tokenizer(REPO / "examples" / "toy-rl" / "tokenizer")
    return images.ImageDocuments(arch.vision, tokenizer, LIMITS, seq_length=128)


def test_an_image_becomes_its_tokens_between_vision_start_and_end_and_takes_no_loss(reader, tmp_path):
    Image.new("RGB", (32, 48), (200, 0, 0)).save(tmp_path / "a.png")
    record = {"prompt": "x<image>y", "response": "red", "images": ["a.png"]}
    document = reader.document(record, "d line 1", tmp_path)
    vision = reader.vision
    # 32 wide x 48 high in 8-pixel patches (frames, rows, columns), merged 2 x 2: 3 x 2 image tokens
    assert document.image_tokens == 6 and document.image_grid_thw.tolist() == [[1, 6, 4]]
    ids = document.token_ids.tolist()
    start = ids.index(vision.vision_start_token_id)
    assert ids[start + 1 : start + 7] == [vision.image_token_id] * 6 and ids[start + 7] == vision.vision_end_token_id
    batch = images.image_batch([document], pad_id=0)
    labels = batch.labels[0]
    assert not (labels == vision.image_token_id).any()
    trained = labels[labels != IGNORE_INDEX].tolist()
    assert trained == [*b"red", 256]  # the response's bytes and the EOS, nothing of the prompt
    assert batch.pixel_values.shape == (24, 3 * 2 * 8 * 8)


def test_the_tiny_model_takes_the_batch_and_the_catalog_counts_its_tower(reader, tmp_path):
    from gdnctl.runtime.model.vision_language import vision_language_model
    from tests.runtime.engine_fixture import tiny_engine_config

    Image.new("RGB", (16, 16), (0, 0, 200)).save(tmp_path / "b.png")
    documents = [
        reader.document({"prompt": "<image>?", "response": "blue", "images": ["b.png"]}, "d line 1", tmp_path),
        reader.document({"prompt": "text only?", "response": "yes"}, "d line 2", tmp_path),
    ]
    config = tiny_engine_config(model=catalog.from_catalog(TINY_VL).model_dump())
    model = vision_language_model(config)
    tower = sum(p.numel() for p in model.model.visual.parameters())
    assert tower == config.model.vision.params()
    logits = model(**images.image_batch(documents, pad_id=0).model_inputs()).logits
    assert logits.shape[:2] == (2, max(len(d) for d in documents)) and torch.isfinite(logits).all()


def test_a_missing_image_stops_the_start_with_its_file_and_line(reader, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "<image>", "response": "r", "images": ["gone.png"]}) + "\n")
    with pytest.raises(DataError, match=rf"{data} line 1 images\[0\]: .*gone.png does not exist"):
        reader.read(data)


def test_a_record_longer_than_seq_length_is_refused_not_cut(reader, tmp_path):
    Image.new("RGB", (64, 64)).save(tmp_path / "c.png")
    short = images.ImageDocuments(reader.vision, reader.tokenizer, LIMITS, seq_length=10)
    with pytest.raises(DataError, match="longer than train.seq_length"):
        short.document({"prompt": "<image>", "response": "r", "images": ["c.png"]}, "d line 1", tmp_path)
