"""How a preset names code of the user's: `"path/to/file.py:name"` or `"package.module:name"`.

The reward function (`grpo.reward.function`) and the environment class (`rollout.environment.class`) are named
this way. A reference whose part before the last colon ends in `.py` is a file (relative to the preset that
names it: the loader makes it absolute); otherwise that part is a module the trainer's interpreter imports. The
part after the colon is a name the file or module defines at its top level.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass

FILE_SUFFIX = ".py"


@dataclass(frozen=True)
class CodeReference:
    file: str | None  # a .py file, as the preset gives it (absolute once the loader resolved it)
    module: str | None  # an importable module, when the reference is not a file
    name: str  # what the file or module defines

    @property
    def text(self) -> str:
        return f"{self.file or self.module}:{self.name}"


def _identifier(part: str) -> bool:
    return part.isidentifier() and not keyword.iskeyword(part)


def parse_code_reference(text: str) -> CodeReference:
    """The file or module and the name `text` names; ValueError with the sentence to show otherwise."""
    source, colon, name = text.rpartition(":")
    if not colon or not source.strip():
        raise ValueError(
            f"'{text}' names no code: write 'path/to/file.py:name' or 'package.module:name' (a colon, then the "
            "function's or class's name)"
        )
    if not _identifier(name):
        raise ValueError(f"'{name}' after the colon in '{text}' is not a Python name")
    if source.endswith(FILE_SUFFIX):
        return CodeReference(file=source, module=None, name=name)
    if all(_identifier(part) for part in source.split(".")):
        return CodeReference(file=None, module=source, name=name)
    raise ValueError(
        f"'{source}' in '{text}' is neither a .py file nor a module name (dotted Python names, such as "
        "my_package.rewards)"
    )
