"""Reading a job's log as it grows, for `gdnctl logs [--follow]` and `gdnctl launch --slurm --wait`.

A log can be larger than memory (a long job's, or a file someone put there), can be something else than a file
(a FIFO at its name blocks a reader), and is written while it is read, so a read can end inside a multi-byte
character. LogTail reads from where it stopped in chunks of CHUNK_BYTES, each handed on before the next is read,
through an incremental UTF-8 decoder, which holds the first bytes of a character cut at a chunk's end until the
rest arrives (bytes that are no UTF-8 become U+FFFD, as the whole log read at once would show them).
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Callable
from pathlib import Path

from gdnctl.errors import GdnctlError
from gdnctl.files import UnreadableFile, open_regular

CHUNK_BYTES = 1024**2


class LogUnreadable(GdnctlError):
    pass


class LogTail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def drain(self, write: Callable[[str], None], *, final: bool = False) -> int:
        """Hand `write` what the log gained since the last call, a chunk at a time; returns the bytes read. With
        `final` (the job has ended), a character still cut at the end is written as U+FFFD."""
        try:
            descriptor, _ = open_regular(self.path)
        except UnreadableFile as error:
            raise LogUnreadable(f"the log {error}; remove it or pass another run dir.") from None
        read = 0
        with os.fdopen(descriptor, "rb") as stream:
            stream.seek(self.offset)
            while chunk := stream.read(CHUNK_BYTES):
                self.offset += len(chunk)
                read += len(chunk)
                text = self._decoder.decode(chunk)
                if text:
                    write(text)
        if final:
            text = self._decoder.decode(b"", final=True)
            if text:
                write(text)
        return read
