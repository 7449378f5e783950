"""A tokenizer directory's chat template, rendered the way transformers renders it, without transformers.

HF tokenizers ship the template as `chat_template` in tokenizer_config.json (a string, or a list of named
templates) or, since transformers 4.43, as a `chat_template.jinja` file beside it. transformers renders it with a
sandboxed jinja2 environment (trim_blocks, lstrip_blocks, the loopcontrols extension), a `raise_exception`
global and a `tojson` filter; the same here, so rl prompts given as chats become the text the model was trained
on. The rendered text still holds the special tokens as text; tokenizers turns them into their ids.

Both files come with the tokenizer, from wherever it was downloaded: they are read through files.py's bounded
reads, and tokenizer_config.json's chat_template is checked for its two shapes (files.typed) before it is used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gdnctl.errors import GdnctlError
from gdnctl.files import MIB, UnreadableFile, read_json, read_text, typed

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
# Qwen3.5's tokenizer_config.json is 20 KiB and its template 8 KiB; some tokenizers list their whole added
# vocabulary in the config (a few MiB).
MAX_TEMPLATE_BYTES = 4 * MIB
MAX_CONFIG_BYTES = 64 * MIB


class _NamedTemplate(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    template: str


# What the config's chat_template may be: one template, or named ones (transformers' two forms); absent or null.
_ChatTemplateField = str | list[_NamedTemplate] | None


class ChatTemplateError(GdnctlError):
    """The tokenizer has no usable chat template, or the template rejected the messages."""


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # where the template came from, for messages
    text: str

    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str):
            raise ChatTemplateError(f"the chat template in {self.source} refused the messages: {message}")

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.globals["raise_exception"] = raise_exception
        environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        try:
            template = environment.from_string(self.text)
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt)
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"the chat template in {self.source} cannot be rendered ({error}).") from None


def load_chat_template(tokenizer_path: str | Path) -> ChatTemplate | None:
    """The chat template of a tokenizer directory (or of the directory holding tokenizer.json); None if none."""
    directory = Path(tokenizer_path)
    directory = directory if directory.is_dir() else directory.parent
    template_file = directory / TEMPLATE_FILE
    if template_file.exists():
        try:
            return ChatTemplate(str(template_file), read_text(template_file, MAX_TEMPLATE_BYTES))
        except UnreadableFile as error:
            raise ChatTemplateError(f"{error}; fix it or remove it to use {CONFIG_FILE}'s chat_template.") from None
    config_file = directory / CONFIG_FILE
    if not config_file.exists():
        return None
    fix = "fix it to read its chat_template, or put the template in chat_template.jinja beside it"
    try:
        config: Any = read_json(config_file, MAX_CONFIG_BYTES)
        if not isinstance(config, dict):
            raise UnreadableFile(f"{config_file} is not a JSON object")
        template = typed(config.get("chat_template"), _ChatTemplateField, f"{config_file}'s chat_template")
    except UnreadableFile as error:
        raise ChatTemplateError(f"{error}; {fix}.") from None
    if isinstance(template, list):  # named templates: the default one serves plain chats
        template = next((entry.template for entry in template if entry.name == "default"), None)
    return ChatTemplate(str(config_file), template) if template else None
