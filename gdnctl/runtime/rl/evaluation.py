"""rl's held-out evaluation: every eval.interval steps, the rollout samples eval.samples_per_prompt responses to
each held-out prompt; their mean reward and pass@k go to metrics.jsonl (an `eval_reward` row), TensorBoard and W&B.

A response passes when its reward is the shipped rewards' full mark (1.0: math_exact's right answer, all of
digit_fraction's characters digits); pass@k is the share of prompts with at least one passing response among their
k = samples_per_prompt (the unbiased estimator of Chen et al. 2021 at n = k). Every evaluation samples with the same
seeds (one per response, algorithm/sampling.py), so two evaluations differ by the weights alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from gdnctl.runtime.rl.algorithm import get_reward, sampling
from gdnctl.runtime.rl.prompts import PromptRecord, check_prompts, describe, load_prompts
from gdnctl.schema import EngineConfig

PASS_REWARD = 1.0
# Added to train.seed for the evaluation's sampling: a seed of its own, the same at every evaluation.
EVAL_SEED_OFFSET = 7_919


def pass_at_k(rewards_per_prompt: Sequence[Sequence[float]]) -> float:
    """Share of prompts with at least one response at the full mark."""
    if not rewards_per_prompt:
        return 0.0
    return sum(any(r >= PASS_REWARD for r in rewards) for rewards in rewards_per_prompt) / len(rewards_per_prompt)


class HeldOutEval:
    def __init__(self, config: EngineConfig, encode: Callable[[PromptRecord], list[int]], log) -> None:
        """Load, encode and length-check the held-out prompts (over-long ones are left out and named)."""
        spec, rollout = config.eval, config.rollout
        self.config, self.spec = config, spec
        records = load_prompts(spec.data_path)
        checked = check_prompts(
            records,
            encode,
            max_model_len=rollout.max_model_len,
            max_response_tokens=spec.max_response_tokens,
            refuse=False,
            where=spec.data_path,
        )
        if checked.dropped:
            log(
                describe(
                    checked.dropped,
                    len(records),
                    spec.data_path,
                    checked.limit,
                    rollout.max_model_len,
                    spec.max_response_tokens,
                )
                + "; the evaluation leaves them out"
            )
        self.records = checked.records[: spec.max_prompts] if spec.max_prompts else checked.records
        self.prompts = [checked.encoded[record.line] for record in self.records]
        self.reward = get_reward(config.grpo.reward)

    def due(self, step: int) -> bool:
        return step % self.spec.interval == 0 or step == self.config.train.train_iters

    def run(self, generate: Callable[..., dict | None], tokenizer, stop_token_ids: list[int], step: int) -> dict | None:
        """One evaluation through the rollout's engines (`generate`: RolloutEngines.generate, collective) -> the
        metrics row's values on rank 0, None on the other ranks."""
        spec = self.spec
        started = time.perf_counter()
        seed = self.config.train.seed + EVAL_SEED_OFFSET
        reply = generate(
            self.prompts,
            n=spec.samples_per_prompt,
            max_tokens=spec.max_response_tokens,
            temperature=spec.temperature,
            seeds=[
                [sampling.sample_seed(seed, prompt, sample) for sample in range(spec.samples_per_prompt)]
                for prompt in range(len(self.prompts))
            ],
            stop_token_ids=stop_token_ids,
        )
        if reply is None:
            return None
        rewards, tokens = [], 0
        for record, outputs in zip(self.records, reply["samples"], strict=True):
            rewards.append([float(self.reward(tokenizer.decode(o["tokens"]), record.answer)) for o in outputs])
            tokens += sum(len(o["tokens"]) for o in outputs)
        flat = [r for group in rewards for r in group]
        return {
            "step": step,
            "eval_reward": sum(flat) / len(flat),
            "eval_pass_at_k": pass_at_k(rewards),
            "eval_k": spec.samples_per_prompt,
            "eval_prompts": len(self.records),
            "eval_response_length": tokens / len(flat),
            "eval_seconds": time.perf_counter() - started,
        }
