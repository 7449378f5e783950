"""The rollout feed, trainer rank 0's side of the loop: which steps' prompts go to the engines when, each finished
sample scored the moment it arrives, and each step's batch once it is whole.

Staleness bound (rollout.max_staleness N). The policy that trains step s has taken s updates (weight version s).
Step s's prompts go to the engines once version s - N is on them (`open_through`), so every sample of step s is
generated under version s - N or later and lags the policy it trains by at most N versions; N = 0 is the on-policy
loop, where step s's rollout starts after the sync that ends step s - 1. With N >= 1 the next steps' rollouts run
while the trainer trains (on engines of their own: validate's RLT019). A step's batch is a function of (seed, step)
(the schedule's prompts, each sample's seed), so a job resumed at step s opens steps s .. s + N again: the batches
that were in flight are generated anew, none trained twice or skipped.

Scoring. `on_finished` runs as each sample finishes (on the rollout stream's thread, rollout/stream.py): the step's
scoring (the job's `scoring(step, record_of)`, grpo.reward's StepRewards: rewards/scoring.py) gives the task's
reward, one `score` call per sample, and its `finish_scored` the step's reward stats once the batch is whole;
grpo.overlong's penalty is added and its truncated samples masked; then the step's StepBatch
(algorithm/step_batch.py) takes it, which may draw further prompts (dynamic sampling) or send a stale sample's
request again.

Where trainer rank 0 does not drive every engine (colocated engines on several nodes), the loop sends each round's
requests through the collective `generate` instead (RlJob._collective_batch) and hands the results here the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gdnctl.runtime.rl.algorithm import PromptPixels, Request, Sample, StepBatch, StepStats, sampling
from gdnctl.runtime.rl.prompts import ImagePrompt, PromptRecord, PromptSchedule, engine_ids
from gdnctl.runtime.rl.rollout import Outgoing
from gdnctl.schema import EngineConfig

# How long the loop's wait for a batch sleeps between looks at the rollout stream's health.
WAIT_SECONDS = 0.5


@dataclass(frozen=True)
class ReadyBatch:
    """One step's batch, ready to train on, and what its rollout did."""

    samples: list[Sample]
    stats: StepStats
    reward_mean: float  # over the step's own prompts' samples (round 0), unbiased by dynamic sampling
    reward_std: float
    generated_tokens: int  # every sample generated for the step, dropped ones too
    began: float  # monotonic: when its first requests went to the engines
    ended: float  # when its last sample arrived
    truncated: int  # samples cut at rollout.max_response_tokens
    masked: int  # samples in the batch that take no loss (truncated under mask_truncated, filler groups)
    overlong_penalty: float  # the mean over-long penalty of the batch's samples (0 without grpo.overlong)
    staleness_mean: float  # weight versions the trained samples lag the step's policy (by their oldest token)
    staleness_max: int
    continued: int  # samples a weight update stopped and continued (rollout.partial)
    extra: dict[str, Any] = field(default_factory=dict)  # the reward's stats (StepRewards.finish_scored)


class RolloutFeed:
    def __init__(
        self,
        config: EngineConfig,
        schedule: PromptSchedule,
        encoded: dict[int, list[int]],
        scoring: Callable[[int, Callable[[int], PromptRecord]], Any],
        submit: Callable[[list[Outgoing]], None],
        *,
        stop_token_ids: list[int],
        first_step: int,
        score_lock: threading.Lock,
        images: dict[int, ImagePrompt] | None = None,
    ) -> None:
        """encoded: prompt line -> token ids; scoring(step, record_of): the step's scorer, whose score(slot, index,
        result) is one sample's task reward, record_of(slot) the record of the step's prompt in that slot; submit:
        hands requests to the engines (the rollout stream's submit, or the collective path's outbox); score_lock:
        held while a sample is scored (the held-out evaluation shares the scorer); images: an image prompt's line
        -> its images (prompts/images.py), which go to the engine with its request and to the trainer with its
        samples."""
        self.config = config
        rollout, grpo = config.rollout, config.grpo
        self.schedule, self.encoded = schedule, encoded
        self.scoring, self.submit, self.score_lock = scoring, submit, score_lock
        self._scorings: dict[int, Any] = {}
        self.stop_token_ids = stop_token_ids
        self.total = config.train.train_iters
        self.max_staleness = rollout.max_staleness
        self.max_rounds = grpo.dynamic_sampling.max_rounds if grpo.dynamic_sampling is not None else 1
        self.overlong = grpo.overlong
        self.opened = first_step  # the next step to open
        self._batches: dict[int, StepBatch] = {}
        self._began: dict[int, float] = {}
        self._ended: dict[int, float] = {}
        self._generated: dict[int, int] = {}
        self._cond = threading.Condition()
        self._images = images or {}
        self._pixels = {  # one object per prompt, which its samples share
            line: PromptPixels(image.pixel_values, image.image_grid_thw) for line, image in self._images.items()
        }
        self._image_token = config.model.vision.image_token_id if self._images else None

    # --- opening steps --------------------------------------------------------------------------------------
    def open_through(self, version: int) -> None:
        """Weight version `version` is on the engines: send every step it may generate (up to version +
        max_staleness, within the run) that is not open yet."""
        last = min(version + self.max_staleness, self.total - 1)
        with self._cond:
            while self.opened <= last:
                step = self.opened
                records = self.schedule.batch(step).records
                self._batches[step] = StepBatch(
                    step,
                    records,
                    lambda record: self.encoded[record.line],
                    n=self.config.rollout.n_samples_per_prompt,
                    seed=self.config.train.seed,
                    max_rounds=self.max_rounds,
                    max_staleness=self.max_staleness,
                    draw=self.schedule.draw,
                )
                self._scorings[step] = self.scoring(step, self._batches[step].record_of)
                self._began[step] = time.monotonic()
                self._generated[step] = 0
                self.opened += 1
                self._send(self._batches[step])

    def _send(self, batch: StepBatch) -> None:
        rollout = self.config.rollout
        requests = batch.take_requests()
        if not requests:
            return
        outgoing = []
        for request in requests:
            spec = {
                "id": request.id,
                "prompt": list(request.prompt),
                "max_tokens": rollout.max_response_tokens,
                "temperature": rollout.temperature,
                "seed": request.seed,
                "stop_token_ids": self.stop_token_ids,
            }
            image = self._images.get(batch.record_of(request.slot).line)
            if image is not None:
                # vLLM expands each image's tokens itself: it gets one image token per image (prompts/images.py).
                spec.update(prompt=engine_ids(image.token_ids, self._image_token), images=list(image.images))
            outgoing.append(Outgoing(key=request, request=spec, min_version=request.step - self.max_staleness))
        self.submit(outgoing)

    # --- samples as they finish -------------------------------------------------------------------------------
    def on_finished(self, request: Request, result: dict) -> None:
        """One finished request (the protocol's collect entry): scored, then handed to its step's batch."""
        with self._cond:
            batch = self._batches.get(request.step)
        if batch is None:  # a step already trained (a request sent again after its batch was taken)
            return
        tokens = list(result["tokens"])
        with self.score_lock:  # the task's reward, one call per sample
            reward = float(self._scorings[request.step].score(request.slot, request.index, result))
        trained = True
        if self.overlong is not None:
            reward += sampling.overlong_penalty(
                len(tokens),
                self.config.rollout.max_response_tokens,
                self.overlong.buffer_tokens,
                self.overlong.penalty,
            )
            trained = not (self.overlong.mask_truncated and result["finish_reason"] == "length")
        sample = Sample(
            group=request.slot,
            prompt=request.prompt,
            response=tuple(tokens),
            rollout_logprobs=tuple(result["logprobs"]),
            finish_reason=str(result["finish_reason"]),
            reward=reward,
            versions=tuple(result["versions"]),
            trained=trained,
            images=self._pixels.get(batch.record_of(request.slot).line),
        )
        with self._cond:
            batch.add(request, sample)
            self._generated[request.step] += len(tokens)
            self._send(batch)
            if batch.ready:
                self._ended[request.step] = time.monotonic()
            self._cond.notify_all()

    # --- the loop's wait --------------------------------------------------------------------------------------
    def wait(self, step: int, *, healthy: Callable[[], bool]) -> ReadyBatch | None:
        """Step `step`'s batch once it is whole; None as soon as `healthy()` says the engines need the current
        weights again (a restarted engine came up behind them), which the loop syncs before it waits again.
        `healthy` raises what ended the rollout stream."""
        with self._cond:
            while not self._batches[step].ready:
                if not healthy():
                    return None
                self._cond.wait(WAIT_SECONDS)
            return self._take(step)

    def ready(self, step: int) -> bool:
        with self._cond:
            return self._batches[step].ready

    def take_outgoing(self, step: int) -> None:
        """The collective path: hand step `step`'s requests that wait (a new round, a stale sample's) to `submit`."""
        with self._cond:
            self._send(self._batches[step])

    def take(self, step: int) -> ReadyBatch:
        with self._cond:
            return self._take(step)

    def _take(self, step: int) -> ReadyBatch:
        batch = self._batches.pop(step)
        with self.score_lock:
            extra = self._scorings.pop(step).finish_scored()
        samples, stats = batch.samples(normalize_std=self.config.grpo.normalize_std)
        rewards = batch.round_zero_rewards()
        mean = sum(rewards) / len(rewards)
        std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
        trained = [s for s in samples if s.trained]
        lags = [sampling.staleness(step, s.version) for s in trained if s.version is not None]
        penalties = (
            [
                sampling.overlong_penalty(
                    len(s.response),
                    self.config.rollout.max_response_tokens,
                    self.overlong.buffer_tokens,
                    self.overlong.penalty,
                )
                for s in samples
            ]
            if self.overlong is not None
            else [0.0]
        )
        return ReadyBatch(
            samples=samples,
            stats=stats,
            reward_mean=mean,
            reward_std=std,
            generated_tokens=self._generated.pop(step),
            began=self._began.pop(step),
            ended=self._ended.pop(step, time.monotonic()),
            truncated=sum(s.finish_reason == "length" for s in samples),
            masked=sum(not s.trained for s in samples),
            overlong_penalty=sum(penalties) / len(penalties),
            staleness_mean=sum(lags) / len(lags) if lags else 0.0,
            staleness_max=max(lags, default=0),
            continued=sum(len(set(s.versions)) > 1 for s in samples),
            extra=extra,
        )
