"""rl's image prompts without an engine: the probe's prefix, the engine's prompt, the rows' images, the vision tokens'
bias, the rl records' image checks, the toy image task's data and its reward."""

from __future__ import annotations

import base64
import io
import json
import runpy
from pathlib import Path

import torch

from gdnctl.knowledge.catalog import from_catalog
from gdnctl.runtime.rl.algorithm import batch as rl_batch
from gdnctl.runtime.rl.algorithm.batch import PromptPixels, Sample
from gdnctl.runtime.rl.prompts import ImagePrompt, engine_ids, probe_prefix, response_bias
from gdnctl.runtime.rl.rewards.shipped import digit_answer_reward
from gdnctl.schema import image_data

ROOT = Path(__file__).parents[3]
VISION = from_catalog("gdnctl/tiny-qwen3.5-vl-bytes").vision
START, END, IMAGE = VISION.vision_start_token_id, VISION.vision_end_token_id, VISION.image_token_id


def _prompt(*pieces) -> ImagePrompt:
    """A prompt of text ids and images (an int n: an image of n image tokens, 4n patches of its 2 x 2n grid)."""
    ids, grids = [], []
    for piece in pieces:
        if isinstance(piece, int):
            ids += [START, *[IMAGE] * piece, END]
            grids.append([1, 2, 2 * piece])
        else:
            ids += list(piece)
    grid = torch.tensor(grids, dtype=torch.int64)
    patches = int(grid.prod(dim=1).sum())
    pixels = torch.arange(patches, dtype=torch.float32)[:, None].expand(patches, 3)
    return ImagePrompt(ids, tuple((8, 8, bytes([n])) for n in range(len(grids))), pixels, grid)


def test_the_probe_runs_through_the_first_image_and_never_ends_inside_one():
    prompt = _prompt((1, 2, 3), 4, (5, 6), 3, (7,) * 10)
    # A cut before the first image is carried through it: the probe must go through the tower.
    early = probe_prefix(prompt, 2, VISION)
    assert early.token_ids == [1, 2, 3, START, IMAGE, IMAGE, IMAGE, IMAGE, END]
    assert len(early.images) == 1 and early.image_grid_thw.tolist() == [[1, 2, 8]]
    assert early.pixel_values.shape[0] == 16
    # A cut inside the second image is carried to its end, with its patches.
    inside = probe_prefix(prompt, 14, VISION)
    assert inside.token_ids[-1] == END and inside.token_ids.count(IMAGE) == 7 and len(inside.images) == 2
    assert torch.equal(inside.pixel_values, prompt.pixel_values)
    # A cut past both images keeps them and cuts the text.
    late = probe_prefix(prompt, len(prompt.token_ids) - 4, VISION)
    assert late.token_ids == prompt.token_ids[:-4] and len(late.images) == 2


def test_the_engine_gets_one_image_token_per_image():
    prompt = _prompt((1,), 4, (2,), 3, (3,))
    assert engine_ids(prompt.token_ids, IMAGE) == [1, START, IMAGE, END, 2, START, IMAGE, END, 3]


def test_a_batch_holds_its_rows_images_in_row_order():
    first, second = _prompt((1,), 1), _prompt((2,), 2)
    pixels = [PromptPixels(p.pixel_values + index, p.image_grid_thw) for index, p in enumerate((first, second))]
    rows = [
        Sample(0, tuple(first.token_ids), (5, 6), (-1.0, -1.0), "stop", 1.0, images=pixels[0]),
        Sample(1, (9, 9), (5,), (-1.0,), "stop", 0.0),
        Sample(2, tuple(second.token_ids), (7,), (-1.0,), "stop", 0.5, images=pixels[1]),
    ]
    batch = rl_batch.build_batch(rows, pad_id=0)
    assert batch.images.image_grid_thw.tolist() == [[1, 2, 2], [1, 2, 4]]
    assert torch.equal(batch.images.pixel_values, torch.cat([pixels[0].pixel_values, pixels[1].pixel_values]))
    assert rl_batch.build_batch(rows[1:2], pad_id=0).images is None


def test_no_response_may_sample_a_vision_token():
    bias = response_bias(VISION)
    assert bias == dict.fromkeys((START, END, IMAGE, VISION.video_token_id), -100.0)


def _png(size=(8, 8)) -> str:
    from PIL import Image

    data = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(data, "PNG")
    return "data:image/png;base64," + base64.b64encode(data.getvalue()).decode()


def test_an_rl_prompt_records_images_are_checked_with_its_file_and_line(tmp_path):
    limits = image_data.ImageLimits(max_per_sample=1, max_bytes=1 << 16, max_pixels=4096)
    records = [
        {"prompt": "Q: <image> How many? A:", "answer": "2", "images": [_png()]},
        {"prompt": [{"role": "user", "content": "<image> How many?"}], "answer": "1", "images": [_png()]},
        {"prompt": "Q: How many? A:", "answer": "2", "images": [_png()]},
        {"prompt": "Q: <image> A:", "answer": "2", "images": ["missing.png"]},
        {"prompt": "Q: <image> A:", "answer": "2", "images": [_png((100, 100))]},
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    problems = list(image_data.check_dataset(path, limits, prompts=True))
    assert len(problems) == 3, problems
    assert problems[0].startswith(f"{path} line 3: the prompt has 0 <image> placeholder(s) for 1 image(s)")
    assert problems[1].startswith(f"{path} line 4") and "missing.png" in problems[1]
    assert problems[2].startswith(f"{path} line 5") and "more than train.images.max_pixels (4,096)" in problems[2]
    # As sft records (no response), every record with images is malformed.
    assert len(list(image_data.check_dataset(path, limits))) == 5


def test_digit_answer_gives_the_full_mark_to_the_right_digit_only():
    assert digit_answer_reward("3", "3") == 1.0
    assert digit_answer_reward(" 3 3", "3") == 1.0
    assert digit_answer_reward("2", "3") == 0.25
    assert digit_answer_reward("3x", "3") == 0.5
    assert digit_answer_reward("ab", "3") == 0.0
    assert digit_answer_reward("  ", "3") == 0.0


def test_the_toy_image_task_is_what_its_generator_writes(tmp_path):
    """The committed datasets hold the generator's pictures, pixel for pixel (PNG bytes may differ with zlib), and
    each picture shows as many squares as its answer says."""
    from PIL import Image

    directory = ROOT / "examples" / "toy-vision"
    generator = runpy.run_path(str(directory / "generate.py"))
    generator["write"](tmp_path)

    def pictures(path: Path) -> list[tuple[str, bytes]]:
        out = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            data = base64.b64decode(record["images"][0].partition(",")[2])
            with Image.open(io.BytesIO(data)) as image:
                out.append((record["answer"], image.convert("RGB").tobytes()))
        return out

    for name in ("prompts.jsonl", "heldout.jsonl"):
        committed = pictures(directory / name)
        assert committed == pictures(tmp_path / name)
        cell = generator["CELL"]
        for answer, pixels in committed:
            image = Image.frombytes("RGB", (generator["SIZE"],) * 2, pixels)
            corners = [image.getpixel((x, y)) for y in range(0, 32, cell) for x in range(0, 32, cell)]
            assert sum(corner != (255, 255, 255) for corner in corners) == int(answer)
    counts = [record[0] for record in pictures(directory / "prompts.jsonl")]
    assert sorted(set(counts)) == ["1", "2", "3", "4"] and len(counts) == 64
