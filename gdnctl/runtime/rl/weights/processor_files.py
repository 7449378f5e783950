"""The files beside the weights that vLLM builds its input processor from, for a rollout on image prompts.

vLLM (0.32.0) expands a prompt's images with Qwen3-VL's multi-modal processor, which needs a tokenizer (vllm/
multimodal/processing/processor.py refuses to build it under skip_tokenizer_init) and transformers'
Qwen3VLProcessor, read from the model's directory: tokenizer.json with the vision tokens (the processor finds
`<|image_pad|>`'s id through the tokenizer) and preprocessor_config.json. The trainer still tokenizes every prompt
itself; vLLM's tokenizer only names the image token to the processor. Random weights' byte tokenizers lack the vision
tokens: they are added at the architecture's ids, which must be the next free ones; a tokenizer that has them at
other ids is refused.
"""

from __future__ import annotations

import json

from gdnctl.errors import GdnctlError
from gdnctl.knowledge import VisionArch

# Qwen's names for the vision tokens (tokenizer_config.json of the Qwen3.5 releases), by the VisionArch field of
# their id.
VISION_TOKENS = {
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
}


class ProcessorFilesError(GdnctlError):
    """The tokenizer's vision tokens are not where the model's config puts them."""


def processor_files(tokenizer, vision: VisionArch) -> dict[str, str]:
    """{file name: text} of tokenizer.json, tokenizer_config.json and preprocessor_config.json for vLLM's input
    processor; `tokenizer` is the job's (runtime/data/pipeline.LocalTokenizer)."""
    from tokenizers import AddedToken, Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend.to_str())
    for field, token in sorted(VISION_TOKENS.items(), key=lambda item: getattr(vision, item[0])):
        wanted = getattr(vision, field)
        found = backend.token_to_id(token)
        if found is None and backend.get_vocab_size(with_added_tokens=True) == wanted:
            backend.add_special_tokens([AddedToken(token, special=True, normalized=False)])
            found = backend.token_to_id(token)
        if found != wanted:
            raise ProcessorFilesError(
                f"the tokenizer holds {token} at id {found} but the model's config gives {field} {wanted}; point "
                "model.tokenizer at the checkpoint's own tokenizer."
            )
    eos = None if tokenizer.eos_id is None else backend.id_to_token(tokenizer.eos_id)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **({} if eos is None else {"eos_token": eos})}
    return {
        "tokenizer.json": backend.to_str(),
        "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
        "preprocessor_config.json": json.dumps(vision.preprocessor_config(), indent=2) + "\n",
    }
