"""The rl prompts: the jsonl dataset and its seeded schedule (`dataset`), every prompt encoded and length-checked
before step 1 (`check`), and a tokenizer's chat template rendered as transformers renders it (`chat_template`)."""

from gdnctl.runtime.exports import lazy_attributes

_HOMES = {
    "PromptDatasetError": "dataset",
    "PromptRecord": "dataset",
    "PromptSchedule": "dataset",
    "load_prompts": "dataset",
    "PromptCheckError": "check",
    "check_prompts": "check",
    "describe": "check",
    "ChatTemplateError": "chat_template",
    "load_chat_template": "chat_template",
}
__all__ = [
    "ChatTemplateError",
    "PromptCheckError",
    "PromptDatasetError",
    "PromptRecord",
    "PromptSchedule",
    "chat_template",
    "check",
    "check_prompts",
    "dataset",
    "describe",
    "load_chat_template",
    "load_prompts",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
