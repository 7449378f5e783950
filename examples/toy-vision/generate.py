"""Writes the toy image task's datasets: prompts.jsonl (64 records) and heldout.jsonl (16), each record a 32 x 32 PNG
of 1 to 4 red squares on white, inline as a data URI, the question how many squares it shows, and the count as the
answer (the shipped digit_answer reward scores it).

Run from anywhere: `python examples/toy-vision/generate.py`; it rewrites both files beside itself, the same bytes
every time (tests/runtime/rl/test_toy_vision.py checks the committed files against it). Each square fills one
8 x 8 cell of a 4 x 4 grid, the tiny vision tower's patches (gdnctl/tiny-qwen3.5-vl-bytes: patch_size 8).
"""

from __future__ import annotations

import base64
import io
import json
import random
from pathlib import Path

from PIL import Image

SIZE, CELL = 32, 8
PROMPT = "Q: <image> How many squares? A:"
FILES = {"prompts.jsonl": (64, 0), "heldout.jsonl": (16, 1)}  # name -> (records, seed)


def picture(count: int, rng: random.Random) -> str:
    """A PNG of `count` red squares in distinct cells, as a data URI."""
    image = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    cells = rng.sample(range((SIZE // CELL) ** 2), count)
    for cell in cells:
        row, column = divmod(cell, SIZE // CELL)
        image.paste((220, 30, 30), (column * CELL, row * CELL, (column + 1) * CELL, (row + 1) * CELL))
    data = io.BytesIO()
    image.save(data, "PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(data.getvalue()).decode()


def records(total: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    counts = [1 + index % 4 for index in range(total)]
    rng.shuffle(counts)
    return [{"prompt": PROMPT, "answer": str(count), "images": [picture(count, rng)]} for count in counts]


def write(directory: Path) -> None:
    for name, (total, seed) in FILES.items():
        lines = [json.dumps(record) for record in records(total, seed)]
        (directory / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    write(Path(__file__).parent)
