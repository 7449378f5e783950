"""Records with images as validate reads them (schema/image_data.py): the two forms, image headers without PIL, and
every problem named with its file and line."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

from gdnctl.schema import image_data

LIMITS = image_data.ImageLimits(max_per_sample=2, max_bytes=1 << 20, max_pixels=64 * 64)


def _encoded(kind: str, size=(13, 7)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buffer, format=kind)
    return buffer.getvalue()


@pytest.mark.parametrize("kind", ["PNG", "JPEG", "GIF", "WEBP", "BMP"])
def test_header_gives_width_and_height(kind):
    assert image_data.image_size(_encoded(kind)) == (13, 7)


def test_lossless_webp_header_gives_width_and_height():
    buffer = io.BytesIO()
    Image.new("RGB", (21, 5)).save(buffer, format="WEBP", lossless=True)
    assert image_data.image_size(buffer.getvalue()) == (21, 5)


def test_bytes_of_no_image_have_no_size():
    assert image_data.image_size(b"not an image at all") is None


def test_prompt_form_puts_each_image_at_its_placeholder():
    record = {"prompt": "a <image> b <image>", "response": "r", "images": ["x.png", {"bytes": "AA=="}]}
    sample = image_data.image_sample(record, "f line 1")
    assert [type(piece).__name__ for piece in sample.prompt] == ["str", "ImageRef", "str", "ImageRef"]
    assert sample.images[0].path == "x.png" and sample.images[1].inline == "AA==" and sample.response == "r"


def test_chat_form_is_chatml_with_the_last_turn_as_the_response():
    record = {
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": "x.png"}, {"type": "text", "text": "colour?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "red"}]},
        ]
    }
    sample = image_data.image_sample(record, "f line 1")
    assert sample.prompt[0] == "<|im_start|>user\n" and sample.images[0].path == "x.png"
    assert sample.prompt[-1] == "colour?<|im_end|>\n<|im_start|>assistant\n"
    assert sample.response == "red<|im_end|>"


def test_every_problem_is_named_with_its_file_and_line(tmp_path):
    (tmp_path / "ok.png").write_bytes(_encoded("PNG"))
    (tmp_path / "big.png").write_bytes(_encoded("PNG", (65, 64)))
    (tmp_path / "junk.png").write_bytes(b"junk")
    inline = base64.b64encode(_encoded("PNG")).decode()
    records = [
        {"prompt": "<image>", "response": "r", "images": ["ok.png"]},
        {"prompt": "<image>", "response": "r", "images": ["missing.png"]},
        {"prompt": "<image>", "response": "r", "images": ["big.png"]},
        {"prompt": "<image>", "response": "r", "images": ["junk.png"]},
        {"prompt": "no placeholder", "response": "r", "images": ["ok.png"]},
        {"prompt": "<image><image><image>", "response": "r", "images": ["ok.png"] * 3},
        {"prompt": "<image>", "response": "r", "images": [f"data:image/png;base64,{inline}"]},
        {"prompt": "plain", "response": "text"},
    ]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(record) + "\n" for record in records))
    problems = list(image_data.check_dataset(data, LIMITS))
    assert [problem.split(":")[0] for problem in problems] == [f"{data} line {n} images[0]" for n in (2, 3, 4)] + [
        f"{data} line 5",
        f"{data} line 6 holds 3 images, more than train.images.max_per_sample (2)",
    ]
    assert "does not exist" in problems[0] and "4,160 pixels" in problems[1] and "not a PNG" in problems[2]
    assert "1 image(s)" in problems[3]


def test_a_record_with_images_needs_train_images(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "<image>", "response": "r", "images": ["x.png"]}) + "\n")
    problems = list(image_data.check_dataset(data, None))
    assert problems == [f"{data} line 1 holds images, but the preset sets no train.images"]


def test_an_image_past_max_bytes_is_named_with_its_size(tmp_path):
    (tmp_path / "ok.png").write_bytes(_encoded("PNG"))
    ref = image_data.ImageRef("f line 1 images[0]", path="ok.png")
    small = image_data.ImageLimits(max_per_sample=1, max_bytes=10, max_pixels=10**6)
    with pytest.raises(image_data.ImageDataError, match=r"more than train.images.max_bytes \(10\)"):
        ref.read(tmp_path, small)
