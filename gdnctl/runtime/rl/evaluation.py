"""rl's held-out evaluation: every eval.interval steps, the rollout samples eval.samples_per_prompt responses to
each held-out prompt; their mean reward and pass@k go to metrics.jsonl (an `eval_reward` row), TensorBoard and W&B.

A response passes when its reward is the shipped rewards' full mark, 1.0 (math_exact's right answer, all of
digit_fraction's characters digits; a reward function, server or environment of the user's counts 1.0 and above as
passing too); pass@k is the share of prompts with at least one passing response among their k = samples_per_prompt
(the unbiased estimator of Chen et al. 2021 at n = k). Every evaluation samples with the same seeds (one per
response, algorithm/sampling.py), so two evaluations differ by the weights alone. The rewards are the training's:
grpo.reward's scorer (the same worker pool or server), or, with rollout.environment, the environment's episodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from gdnctl.runtime.rl.algorithm import sampling as sample_seeds
from gdnctl.runtime.rl.prompts import ImagePrompt, PromptRecord, check_prompts, describe, engine_ids, load_prompts
from gdnctl.runtime.rl.rewards import StepRewards
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
    def __init__(
        self,
        config: EngineConfig,
        encode: Callable[[PromptRecord], list[int]],
        log,
        *,
        scorer=None,
        episodes=None,
        prompt_text: Callable[[PromptRecord], str] | None = None,
        images: dict[int, ImagePrompt] | None = None,
    ) -> None:
        """Load, encode and length-check the held-out prompts (over-long ones are left out and named). `scorer`:
        rank 0's grpo.reward scorer; `episodes`: the environment's runner, which scores instead; `images`: where
        `encode` keeps an image prompt's images by its line, which go to the engines with it."""
        spec, rollout = config.eval, config.rollout
        self.config, self.spec, self.log = config, spec, log
        self.scorer, self.episodes, self.prompt_text = scorer, episodes, prompt_text
        environment = episodes is not None
        records = load_prompts(
            spec.data_path,
            needs_prompt=not environment,
            needs_answer=not environment and isinstance(config.grpo.reward, str),
        )
        if environment:  # the environment's opening, its messages' lines named after the held-out file
            encode = lambda record: episodes.opening(record, f"{spec.data_path}:{record.line}")[2]  # noqa: E731
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
        # An image prompt goes to vLLM with one image token per image, which it expands (prompts/images.py).
        self.images: list | None = None
        if images:
            image_token = config.model.vision.image_token_id
            pictured = [images.get(record.line) for record in self.records]
            self.prompts = [
                prompt if image is None else engine_ids(image.token_ids, image_token)
                for prompt, image in zip(self.prompts, pictured, strict=True)
            ]
            self.images = [None if image is None else list(image.images) for image in pictured]

    def due(self, step: int) -> bool:
        return step % self.spec.interval == 0 or step == self.config.train.train_iters

    def run(
        self,
        generate: Callable[..., dict | None],
        tokenizer,
        stop_token_ids: list[int],
        step: int,
        *,
        share: Callable | None = None,
        leader: bool = True,
    ) -> dict | None:
        """One evaluation through the rollout's engines (`generate`: RolloutEngines.generate, collective) -> the
        metrics row's values on rank 0, None on the other ranks. `share`: rank 0's value on every rank (the
        episodes' turns), `leader`: this is rank 0."""
        spec = self.spec
        started = time.perf_counter()
        seed = self.config.train.seed + EVAL_SEED_OFFSET
        sampling = {
            "max_tokens": spec.max_response_tokens,
            "temperature": spec.temperature,
            "stop_token_ids": stop_token_ids,
        }
        if self.episodes is not None:
            rewards, tokens = self._episodes(generate, share, leader, {**sampling, "seed": seed})
            if rewards is None:
                return None
        else:
            scoring = self._scoring(tokenizer, step) if leader else None
            reply = generate(
                self.prompts,
                n=spec.samples_per_prompt,
                **sampling,
                seeds=[
                    [sample_seeds.sample_seed(seed, prompt, sample) for sample in range(spec.samples_per_prompt)]
                    for prompt in range(len(self.prompts))
                ],
                on_samples=None if scoring is None else scoring.answered,
                images=self.images,
            )
            if reply is None:
                return None
            scores, _ = scoring.finish(reply["samples"])
            rewards, place = [], 0
            for outputs in reply["samples"]:
                rewards.append(scores[place : place + len(outputs)])
                place += len(outputs)
            tokens = sum(len(o["tokens"]) for outputs in reply["samples"] for o in outputs)
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

    def _scoring(self, tokenizer, step: int) -> StepRewards:
        return StepRewards(
            self.scorer,
            self.config.grpo.reward,
            decode=tokenizer.decode,
            records=self.records,
            prompt_texts=[self.prompt_text(record) for record in self.records],
            dataset="eval.data_path",
            log=self.log,
            logs_dir=None,
            step=step,
            timeline=False,
        )

    def _episodes(self, generate, share, leader: bool, sampling: dict) -> tuple[list[list[float]] | None, int]:
        """The held-out prompts' episodes -> (rank 0) each prompt's rewards and the model's tokens."""
        ran = self.episodes.run(
            self.records,
            n=self.spec.samples_per_prompt,
            generate=generate,
            share=share,
            leader=leader,
            dataset="eval.data_path",
            **sampling,
        )
        if ran is None:
            return None, 0
        samples, _, _ = ran
        rewards: list[list[float]] = [[] for _ in self.records]
        for sample in samples:
            rewards[sample.group].append(sample.reward)
        return rewards, sum(sum(sample.loss_mask) for sample in samples)
