"""Draw an rl run's step timeline (its metrics.jsonl timestamps) as a PNG, with no dependency beyond the standard
library: one panel per run, a lane each for the rollout (from a step's first request to its last sample), the
trainer's update and the weight sync, every step in its own colour, so a step's rollout drawn under the update of
the step before shows the two overlapping.

    python benchmarks/rl_timeline.py RUN_DIR[=LABEL] [RUN_DIR[=LABEL] ...] --out docs/figures/rl-timeline.png
        [--steps N]

The rows read are the rl job's (runtime/rl/job.py RlStepStats): rollout_began_s / rollout_ended_s,
train_began_s / train_ended_s, sync_began_s / sync_ended_s, seconds since the job started. Each panel's time axis
starts at its first step's rollout.
"""

from __future__ import annotations

import argparse
import json
import struct
import zlib
from pathlib import Path

# A 5 x 7 bitmap font for the labels: each glyph is 7 rows of 5 columns, "#" on.
_GLYPHS = {
    "A": (".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"),
    "B": ("####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."),
    "C": (".####", "#....", "#....", "#....", "#....", "#....", ".####"),
    "D": ("####.", "#...#", "#...#", "#...#", "#...#", "#...#", "####."),
    "E": ("#####", "#....", "#....", "####.", "#....", "#....", "#####"),
    "F": ("#####", "#....", "#....", "####.", "#....", "#....", "#...."),
    "G": (".####", "#....", "#....", "#.###", "#...#", "#...#", ".###."),
    "H": ("#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"),
    "I": ("#####", "..#..", "..#..", "..#..", "..#..", "..#..", "#####"),
    "J": ("..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."),
    "K": ("#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"),
    "L": ("#....", "#....", "#....", "#....", "#....", "#....", "#####"),
    "M": ("#...#", "##.##", "#.#.#", "#...#", "#...#", "#...#", "#...#"),
    "N": ("#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#", "#...#"),
    "O": (".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."),
    "P": ("####.", "#...#", "#...#", "####.", "#....", "#....", "#...."),
    "Q": (".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"),
    "R": ("####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"),
    "S": (".####", "#....", "#....", ".###.", "....#", "....#", "####."),
    "T": ("#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."),
    "U": ("#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."),
    "W": ("#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."),
    "V": ("#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."),
    "X": ("#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"),
    "Y": ("#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."),
    "0": (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    "1": ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "2": (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    "3": ("####.", "....#", "....#", ".###.", "....#", "....#", "####."),
    "4": ("#...#", "#...#", "#...#", "#####", "....#", "....#", "....#"),
    "5": ("#####", "#....", "####.", "....#", "....#", "....#", "####."),
    "6": (".###.", "#....", "#....", "####.", "#...#", "#...#", ".###."),
    "7": ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    "8": (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    "9": (".###.", "#...#", "#...#", ".####", "....#", "....#", ".###."),
    " ": (".....",) * 7,
    ".": (".....",) * 6 + ("..#..",),
    ":": (".....", "..#..", ".....", ".....", ".....", "..#..", "....."),
    "-": (".....", ".....", ".....", "#####", ".....", ".....", "....."),
    "_": (".....",) * 6 + ("#####",),
    "=": (".....", ".....", "#####", ".....", "#####", ".....", "....."),
    "(": ("...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."),
    ")": (".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."),
    "/": ("....#", "....#", "...#.", "..#..", ".#...", "#....", "#...."),
}
_PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75)]
WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (200, 200, 200)


class Canvas:
    """An RGB image in memory, written as a PNG (zlib and struct only)."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(WHITE * (width * height))

    def rect(self, x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int]) -> None:
        for y in range(max(y0, 0), min(y1, self.height)):
            row = y * self.width
            for x in range(max(x0, 0), min(x1, self.width)):
                self.pixels[3 * (row + x) : 3 * (row + x) + 3] = bytes(colour)

    def text(self, x: int, y: int, text: str, scale: int = 2, colour: tuple[int, int, int] = BLACK) -> None:
        for glyph in text.upper():
            rows = _GLYPHS.get(glyph, _GLYPHS[" "])
            for row, bits in enumerate(rows):
                for column, bit in enumerate(bits):
                    if bit == "#":
                        self.rect(
                            x + column * scale, y + row * scale, x + (column + 1) * scale, y + (row + 1) * scale, colour
                        )
            x += 6 * scale

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[3 * y * self.width : 3 * (y + 1) * self.width]) for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack("!I", len(data)) + kind + data + struct.pack("!I", zlib.crc32(kind + data))

        header = struct.pack("!IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        image = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        return b"\x89PNG\r\n\x1a\n" + image


def steps_of(run_dir: Path, limit: int | None) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [row for row in rows if "rollout_began_s" in row]
    return steps[:limit] if limit else steps


LANES = (("ROLLOUT", "rollout"), ("TRAIN", "train"), ("SYNC", "sync"))


def draw(runs: list[tuple[str, list[dict]]], out: Path, width: int = 1400) -> None:
    left, right, lane, gap, title = 130, 30, 34, 10, 30
    panel = title + len(LANES) * (lane + gap) + 40
    canvas = Canvas(width, panel * len(runs) + 20)
    span = max(s["sync_ended_s"] - s0["rollout_began_s"] for _, steps in runs for s0 in steps[:1] for s in steps)
    scale = (width - left - right) / span
    for index, (label, steps) in enumerate(runs):
        top = 10 + index * panel
        zero = steps[0]["rollout_began_s"]
        canvas.text(left, top + 4, label)
        for lane_index, (name, key) in enumerate(LANES):
            y = top + title + lane_index * (lane + gap)
            canvas.text(10, y + 10, name)
            canvas.rect(left, y + lane, width - right, y + lane + 1, GREY)
            for number, step in enumerate(steps):
                x0 = left + int((step[f"{key}_began_s"] - zero) * scale)
                x1 = max(left + int((step[f"{key}_ended_s"] - zero) * scale), x0 + 2)
                colour = _PALETTE[number % len(_PALETTE)]
                # Overlapping rollouts (several steps in flight) share the lane: each in its own band of it.
                band = lane // 2 if key == "rollout" else 0
                offset = (number % 2) * band if band else 0
                canvas.rect(x0, y + offset, x1, y + offset + (band or lane), colour)
                if key == "train" and x1 - x0 > 30:
                    canvas.text(x0 + 4, y + 10, str(step["step"]), scale=2, colour=WHITE)
        axis = top + title + len(LANES) * (lane + gap)
        for second in range(0, int(span) + 1, max(1, int(span // 10))):
            x = left + int(second * scale)
            canvas.rect(x, axis, x + 1, axis + 6, BLACK)
            canvas.text(x - 6, axis + 10, f"{second}S", scale=1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(canvas.png())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="RUN_DIR or RUN_DIR=LABEL")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=None, help="draw the first N steps only")
    args = parser.parse_args()
    runs = []
    for spec in args.runs:
        directory, _, label = spec.partition("=")
        runs.append((label or Path(directory).name, steps_of(Path(directory), args.steps)))
    draw(runs, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
