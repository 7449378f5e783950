"""The rl prompts: the jsonl dataset and its seeded schedule (`dataset`), every prompt encoded and length-checked
before step 1 (`check`), a tokenizer's chat template rendered as transformers renders it (`chat_template`), and a
prompt with images as the trainer and vLLM each take it (`images`)."""

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
    "ImagePrompt": "images",
    "ImagePrompts": "images",
    "probe_prefix": "images",
    "response_bias": "images",
    "engine_ids": "images",
    "token_types": "images",
}
__all__ = [
    "ChatTemplateError",
    "ImagePrompt",
    "ImagePrompts",
    "PromptCheckError",
    "PromptDatasetError",
    "PromptRecord",
    "PromptSchedule",
    "chat_template",
    "check",
    "check_prompts",
    "dataset",
    "describe",
    "engine_ids",
    "images",
    "load_chat_template",
    "load_prompts",
    "probe_prefix",
    "response_bias",
    "token_types",
]
__getattr__ = lazy_attributes(__name__, _HOMES)
