"""A tokenizer directory's chat template, rendered the way transformers renders it, without transformers.

HF tokenizers ship the template as `chat_template` in tokenizer_config.json (a string, or a list of named
templates) or, since transformers 4.43, as a `chat_template.jinja` file beside it. transformers renders it with a
sandboxed jinja2 environment (trim_blocks, lstrip_blocks, the loopcontrols extension), a `raise_exception`
global and a `tojson` filter; the same here, so rl prompts given as chats become the text the model was trained
on. The rendered text still holds the special tokens as text; tokenizers turns them into their ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gdnctl.errors import GdnctlError

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"


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
    if template_file.is_file():
        return ChatTemplate(str(template_file), template_file.read_text(encoding="utf-8"))
    config_file = directory / CONFIG_FILE
    if not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ChatTemplateError(f"{config_file} is not valid JSON; fix it to read its chat_template.") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named templates: the default one serves plain chats
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    return ChatTemplate(str(config_file), template) if isinstance(template, str) and template else None
