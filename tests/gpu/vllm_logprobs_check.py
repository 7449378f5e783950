"""Run by test_lora_gpu.py with vLLM's python (GDNCTL_TEST_VLLM_PYTHON): serve an HF checkpoint and score given
token rows, each token's log-prob given the tokens before it (vLLM's prompt log-probs).

    python tests/gpu/vllm_logprobs_check.py CHECKPOINT_DIR ROWS_JSON

ROWS_JSON: a file holding a list of token-id lists. Prints one line, RESULT_PREFIX and JSON (vLLM logs to stdout
too): the architecture vLLM served and, per row, the log-prob of every token after the first. The engine settings
are the GPU rl tests' (a fixed KV cache, eager, the Triton GDN prefill); a vision-language config is served with
images and videos off, as the rollout serves it (runtime/rl/rollout/server.py engine_kwargs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULT_PREFIX = "gdnctl-vllm-logprobs: "


def main(directory: str, rows_file: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    rows = json.loads(Path(rows_file).read_text())
    config = json.loads((Path(directory) / "config.json").read_text())
    vision_language = any(name.endswith("ForConditionalGeneration") for name in config.get("architectures", []))
    llm = LLM(
        model=directory,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        seed=0,
        max_model_len=256,
        enforce_eager=True,
        # vLLM still wants this share of the GPU free at start-up beside a fixed KV cache; GPU tests share the GPU.
        gpu_memory_utilization=0.1,
        kv_cache_memory_bytes=1 << 30,
        gdn_prefill_backend="triton",
        **({"limit_mm_per_prompt": {"image": 0, "video": 0}} if vision_language else {}),
    )
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=row) for row in rows],
        SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
        use_tqdm=False,
    )
    log_probs = [
        [position[token].logprob for position, token in zip(output.prompt_logprobs[1:], row[1:], strict=True)]
        for output, row in zip(outputs, rows, strict=True)
    ]
    print(
        RESULT_PREFIX
        + json.dumps({"architectures": llm.llm_engine.model_config.architectures, "log_probs": log_probs}),
        flush=True,
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
