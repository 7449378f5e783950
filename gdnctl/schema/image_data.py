"""Training records with images: their two forms, where an image's bytes come from, and the checks every image meets.

Read by validate (before any GPU is spent) and by the job's start (runtime/data/images.py); stdlib only, so that
`gdnctl validate` reads an image's width and height from its header without PIL or torch.

A record of a jsonl file carries images in one of two forms:
- `{"prompt": "... <image> ...", "response": "...", "images": [IMAGE, ...]}`: one `<image>` in the prompt for each
  image, in order (the form of geometry3k and AReaL's and verl's image datasets);
- `{"messages": [{"role": ..., "content": [{"type": "image", "image": IMAGE}, {"type": "text", "text": ...}]}, ...]}`:
  HF's chat format with image parts (`content` may also be a plain string); the last message is the assistant's
  response, the ones before it the prompt, in Qwen's chat format (ChatML).
An IMAGE is a path relative to the dataset file (or absolute), a `data:image/...;base64,...` URI, or
`{"path": ...}` / `{"bytes": BASE64}`.

Only the response trains: the prompt's text and its image tokens take no loss. An rl job's prompt records carry
images the first way, beside a prompt and its answer (prompt_sample).
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gdnctl.files import MIB, UnreadableFile, read_jsonl, read_regular

PLACEHOLDER = "<image>"
# A record with its inline images is at most this long (a few images of some MiB as base64).
MAX_IMAGE_RECORD_BYTES = 256 * MIB
# How many problems validate lists before it says how many more there are.
MAX_LISTED_PROBLEMS = 5
# Qwen's chat format (ChatML), as its chat template writes a turn.
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>\n"
_DATA_URI_PREFIX = "data:image/"


class ImageDataError(ValueError):
    """A record's images cannot be used: one sentence naming where, without the fix."""


@dataclass(frozen=True)
class ImageLimits:
    """What every image must meet (train.images)."""

    max_per_sample: int
    max_bytes: int
    max_pixels: int


@dataclass(frozen=True)
class ImageRef:
    """One image of a record: `where` it stands in the record, and its file or its inline bytes."""

    where: str
    path: str | None = None
    inline: str | None = None  # base64 text

    def read(self, base_dir: Path, limits: ImageLimits) -> tuple[bytes, tuple[int, int]]:
        """The image's bytes and (width, height), within `limits`; ImageDataError saying why not."""
        if self.path is not None:
            target = Path(self.path) if Path(self.path).is_absolute() else base_dir / self.path
            try:
                data = read_regular(target, limits.max_bytes)
            except UnreadableFile as error:
                if target.is_file() and target.stat().st_size > limits.max_bytes:
                    raise ImageDataError(
                        f"{self.where}: {target} has {target.stat().st_size:,} bytes, more than "
                        f"train.images.max_bytes ({limits.max_bytes:,})"
                    ) from None
                raise ImageDataError(f"{self.where}: {error}") from None
        else:
            try:
                data = base64.b64decode(self.inline or "", validate=True)
            except (binascii.Error, ValueError):
                raise ImageDataError(f"{self.where}: the inline image is not base64") from None
            if len(data) > limits.max_bytes:
                raise ImageDataError(
                    f"{self.where}: the inline image has {len(data):,} bytes, more than train.images.max_bytes "
                    f"({limits.max_bytes:,})"
                )
        size = image_size(data)
        if size is None:
            raise ImageDataError(f"{self.where}: {self.label} is not a PNG, JPEG, GIF, WebP or BMP image")
        width, height = size
        if width < 1 or height < 1:
            raise ImageDataError(f"{self.where}: {self.label} is {width} x {height} pixels, an empty image")
        if width * height > limits.max_pixels:
            raise ImageDataError(
                f"{self.where}: {self.label} is {width} x {height} = {width * height:,} pixels, more than "
                f"train.images.max_pixels ({limits.max_pixels:,})"
            )
        return data, size

    @property
    def label(self) -> str:
        return self.path if self.path is not None else "the inline image"


@dataclass(frozen=True)
class ImageSample:
    """A record with images: the prompt as text pieces and images in order, and the response (which trains)."""

    prompt: tuple[str | ImageRef, ...]
    response: str

    @property
    def images(self) -> list[ImageRef]:
        return [piece for piece in self.prompt if isinstance(piece, ImageRef)]


def has_images(record: Any) -> bool:
    """Whether a record carries images in either form (a shape check only)."""
    if not isinstance(record, dict):
        return False
    if record.get("images"):
        return True
    messages = record.get("messages")
    return isinstance(messages, list) and any(
        isinstance(message, dict)
        and isinstance(message.get("content"), list)
        and any(isinstance(part, dict) and part.get("type") == "image" for part in message["content"])
        for message in messages
    )


def image_sample(record: Any, where: str) -> ImageSample:
    """The record (one with images: has_images) as prompt pieces and response; ImageDataError naming the field."""
    if not isinstance(record, dict):
        raise ImageDataError(f"{where} is not a JSON object")
    if "messages" in record:
        return _chat_sample(record["messages"], where)
    prompt, response, images = record.get("prompt"), record.get("response"), record.get("images")
    if not isinstance(prompt, str) or not isinstance(response, str):
        raise ImageDataError(f'{where} has images but no "prompt" and "response" strings beside them')
    if not isinstance(images, list):
        raise ImageDataError(f'{where}: "images" is not a list')
    texts = prompt.split(PLACEHOLDER)
    if len(texts) - 1 != len(images):
        raise ImageDataError(
            f"{where}: the prompt has {len(texts) - 1} {PLACEHOLDER} placeholder(s) for {len(images)} image(s); "
            f"put one {PLACEHOLDER} where each image goes"
        )
    pieces: list[str | ImageRef] = [texts[0]]
    for index, (image, text) in enumerate(zip(images, texts[1:], strict=True)):
        pieces += [_image_ref(image, f"{where} images[{index}]"), text]
    return ImageSample(tuple(piece for piece in pieces if piece != ""), response)


def _chat_sample(messages: Any, where: str) -> ImageSample:
    if not isinstance(messages, list) or len(messages) < 2:
        raise ImageDataError(f'{where}: "messages" is not a list of at least a prompt turn and a response')
    *turns, last = messages
    if not isinstance(last, dict) or last.get("role") != "assistant":
        raise ImageDataError(f"{where}: the last message is not the assistant's response")
    pieces: list[str | ImageRef] = []
    for number, message in enumerate(turns):
        at = f"{where} messages[{number}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ImageDataError(f'{at} is not an object with a "role"')
        pieces.append(f"{TURN_START}{message['role']}\n")
        pieces += _content(message.get("content"), at)
        pieces.append(TURN_END)
    pieces.append(f"{TURN_START}assistant\n")
    response = _content(last.get("content"), f"{where} messages[{len(turns)}]")
    if any(isinstance(piece, ImageRef) for piece in response):
        raise ImageDataError(f"{where}: the assistant's response holds an image; images go in the prompt's turns")
    return ImageSample(_merged(pieces), "".join(str(piece) for piece in response) + TURN_END.rstrip("\n"))


def _content(content: Any, where: str) -> list[str | ImageRef]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise ImageDataError(f'{where}: "content" is neither a string nor a list of parts')
    pieces: list[str | ImageRef] = []
    for number, part in enumerate(content):
        at = f"{where}.content[{number}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif kind == "image":
            image = part.get("image", part.get("path", part.get("url")))
            if image is None and "bytes" in part:
                image = {"bytes": part["bytes"]}
            pieces.append(_image_ref(image, at))
        else:
            raise ImageDataError(f'{at} is neither {{"type": "text", "text": ...}} nor {{"type": "image", ...}}')
    return pieces


def _merged(pieces: list[str | ImageRef]) -> tuple[str | ImageRef, ...]:
    """Adjacent text pieces as one."""
    merged: list[str | ImageRef] = []
    for piece in pieces:
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        elif piece != "":
            merged.append(piece)
    return tuple(merged)


def _image_ref(image: Any, where: str) -> ImageRef:
    if isinstance(image, dict) and isinstance(image.get("bytes"), str):
        return ImageRef(where, inline=image["bytes"])
    if isinstance(image, dict) and isinstance(image.get("path"), str):
        image = image["path"]
    if isinstance(image, str) and image.startswith(_DATA_URI_PREFIX):
        header, _, data = image.partition(",")
        if not header.endswith(";base64"):
            raise ImageDataError(f"{where}: a data URI image must be base64 (data:image/png;base64,...)")
        return ImageRef(where, inline=data)
    if isinstance(image, str) and image:
        if "://" in image:
            raise ImageDataError(f"{where}: {image} is a URL; gdnctl reads local files only, download it first")
        return ImageRef(where, path=image)
    raise ImageDataError(
        f'{where} is not an image: a path, a data:image/...;base64 URI, {{"path": ...}} or {{"bytes": BASE64}}'
    )


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG, JPEG, GIF, WebP or BMP header; None when the bytes are none of these."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data.startswith(b"BM") and len(data) >= 26:
        width, height = struct.unpack("<ii", data[18:26])
        return width, abs(height)
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


# JPEG start-of-frame markers (baseline, progressive, ...): not DHT (C4), JPG (C8) or DAC (CC).
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if 0xD0 <= marker <= 0xD9 or marker == 0x01:  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _JPEG_FRAMES:
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return None


def check_dataset(path: Path, limits: ImageLimits | None, *, prompts: bool = False) -> Iterator[str]:
    """Every problem of the images of a jsonl dataset, each a sentence naming the file and line: a record whose
    images are malformed, missing, unreadable, not an image, or past `limits` (None: the preset sets no
    train.images, so a record with images is itself the problem). `prompts`: an rl job's prompt records
    (prompt_sample). A file that cannot be read yields nothing: the rules about the file itself say so."""
    try:
        for number, record in read_jsonl(path, MAX_IMAGE_RECORD_BYTES):
            yield from _record_problems(record, f"{path} line {number}", path.parent, limits, prompts)
    except UnreadableFile:
        return


def prompt_sample(record: Any, where: str) -> ImageSample:
    """An rl prompt record with images: `{"prompt": ..., "answer": ..., "images": [IMAGE, ...]}`, the prompt a string
    or chat messages with string contents, one `<image>` in its text for each image; ImageDataError naming the
    field. Its response is empty (the rollout samples it)."""
    prompt = record.get("prompt") if isinstance(record, dict) else None
    if isinstance(prompt, list) and all(
        isinstance(message, dict) and isinstance(message.get("content"), str) for message in prompt
    ):
        prompt = "".join(message["content"] for message in prompt)
    if not isinstance(prompt, str):
        raise ImageDataError(
            f'{where} has images but its "prompt" is neither a string nor chat messages with string contents'
        )
    return image_sample({"prompt": prompt, "response": "", "images": record.get("images")}, where)


def _record_problems(
    record: Any, where: str, base_dir: Path, limits: ImageLimits | None, prompts: bool
) -> Iterator[str]:
    if not has_images(record):
        return
    if limits is None:
        yield f"{where} holds images, but the preset sets no train.images"
        return
    try:
        sample = prompt_sample(record, where) if prompts else image_sample(record, where)
    except ImageDataError as error:
        yield str(error)
        return
    if len(sample.images) > limits.max_per_sample:
        yield (
            f"{where} holds {len(sample.images)} images, more than train.images.max_per_sample "
            f"({limits.max_per_sample})"
        )
    for image in sample.images:
        try:
            image.read(base_dir, limits)
        except ImageDataError as error:
            yield str(error)
