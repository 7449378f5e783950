"""The rewards of one batch of samples, whichever scorer grpo.reward names (`make_scorer`: its table of forms), and
what the loop does with them (`StepRewards`): samples submitted as each engine's answer arrives, scores collected
once all are in, failures handled as grpo.reward.on_error says, and the times that show how scoring overlapped
generation.

The shipped rewards score inline as each sample is submitted, as they always did, and add nothing to a step's
metrics. A function or a server adds, per step: reward_failures (samples whose call failed and took
grpo.reward.default_score), reward_overlap_seconds (scoring done while some engine was still generating, summed
over samples), reward_wait_seconds (from the last engine's answer to the last score: what scoring added to the
step), and `reward/NAME`, the mean of each extra number the scorer returned. RUN_DIR/logs/reward_timeline.jsonl
has every step's times: when generation began, when each engine answered, and each sample's submission, start
and end; RUN_DIR/logs/reward_failures.jsonl every failed sample with its response.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.rewards.http_client import ServerScorer
from gdnctl.runtime.rl.rewards.pool import FunctionPool
from gdnctl.runtime.rl.rewards.results import Collector, RewardRequest, RewardResult
from gdnctl.runtime.rl.rewards.shipped import get_reward
from gdnctl.runtime.rl.user_code import describe
from gdnctl.schema import EngineRewardFunction, EngineRewardServer

TIMELINE_FILE = "reward_timeline.jsonl"
FAILURES_FILE = "reward_failures.jsonl"
# Failed samples named in the job's output per batch; the rest are counted there and listed in the failures file.
NAMED_FAILURES = 3


class RewardFunctionError(GdnctlError):
    """The user's reward function failed on a sample and grpo.reward.on_error is stop."""

    exit_code = 1


class ShippedScorer(Collector):
    """A shipped rule (shipped.py), run inline on each sample as it is submitted."""

    kind = "shipped"

    def __init__(self, name: str) -> None:
        super().__init__()
        self.function = get_reward(name)

    def submit(self, request: RewardRequest) -> None:
        began = time.time()
        score = float(self.function(request.response, str(request.record.get("answer", ""))))
        self._deliver(self._ticket(), RewardResult(score, {}, None, began, began, time.time()))

    def close(self) -> None:
        pass


# grpo.reward's mapping forms -> their scorer (a shipped reward's name is the other form).
SCORERS: dict[str, Callable[[Any], Collector]] = {"function": FunctionPool, "server": ServerScorer}


def make_scorer(spec: str | EngineRewardFunction | EngineRewardServer):
    """The scorer grpo.reward names: started (worker processes, the server's check) and ready for samples."""
    if isinstance(spec, str):
        return ShippedScorer(spec)
    return SCORERS[spec.kind](spec)


class StepRewards:
    """One batch's samples through `scorer`: `answered` submits an engine's samples as they arrive (the callback of
    RolloutEngines.generate), `finish` submits the rest and returns every sample's reward and the batch's stats."""

    def __init__(
        self,
        scorer,
        spec: str | EngineRewardFunction | EngineRewardServer,
        *,
        decode: Callable[[Sequence[int]], str],
        records: Sequence,
        prompt_texts: Sequence[str],
        dataset: str,
        log: Callable[[str], None],
        logs_dir: Path | None,
        step: int,
        timeline: bool,
    ) -> None:
        self.scorer, self.spec = scorer, spec
        self.decode, self.records, self.prompt_texts = decode, records, prompt_texts
        self.dataset, self.log, self.logs_dir, self.step = dataset, log, logs_dir, step
        self.timeline = timeline and logs_dir is not None and not isinstance(spec, str)
        self.began = time.time()
        self.answers: list[tuple[int, int, float]] = []  # (first prompt, prompts, arrival time) per engine answer
        self.order: list[tuple[int, int]] = []  # (prompt, sample) of every submission, in submission order
        self.submitted: set[int] = set()
        self.responses: dict[tuple[int, int], str] = {}
        self.scored: list[RewardResult] = []  # what `score` returned, in order

    def answered(self, start: int, groups: Sequence[Sequence[dict]]) -> None:
        """An engine's samples for prompts start, start + 1, ...: each is decoded and submitted at once."""
        self.answers.append((start, len(groups), time.time()))
        for offset, outputs in enumerate(groups):
            self._submit(start + offset, outputs)

    def _submit(self, prompt: int, outputs: Sequence[dict]) -> None:
        self.submitted.add(prompt)
        for sample, output in enumerate(outputs):
            self._submit_one(prompt, sample, output, f" of {len(outputs)}")

    def _submit_one(self, prompt: int, sample: int, output: dict, of: str = "") -> None:
        record = self.records[prompt]
        text = self.decode(output["tokens"])
        self.responses[(prompt, sample)] = text
        self.order.append((prompt, sample))
        self.scorer.submit(
            RewardRequest(
                prompt=self.prompt_texts[prompt],
                response=text,
                response_ids=tuple(output["tokens"]),
                record=record.fields,
                where=f"{self.dataset} line {record.line}, sample {sample + 1}{of}",
            )
        )

    # --- the streaming rollout: one sample at a time, as each finishes ------------------------------------------
    def score(self, prompt: int, sample: int, output: dict) -> float:
        """Sample `sample` of prompt `prompt` scored the moment it finished (the streaming rollout's call, once per
        sample): submitted and collected at once, so the step's batch knows its reward; a failure under
        grpo.reward.on_error: stop raises here. `finish_scored` gives the step's stats once its batch is whole."""
        self.answers.append((prompt, 1, time.time()))
        self._submit_one(prompt, sample, output)
        (result,) = self.scorer.collect()
        self.scored.append(result)
        if result.failure and isinstance(self.spec, EngineRewardFunction) and self.spec.on_error == "stop":
            self._failures([((prompt, sample), result)])
        return result.score

    def finish_scored(self) -> dict[str, Any]:
        """The stats of the samples `score` scored (none for a shipped reward), their failures logged."""
        generated = max((at for _, _, at in self.answers), default=time.time())
        failed = [(key, result) for key, result in zip(self.order, self.scored, strict=True) if result.failure]
        if failed:
            self._failures(failed)
        if isinstance(self.spec, str):
            return {}
        if self.timeline:
            self._write_timeline(generated, self.scored)
        return self._stats(self.scored, generated, len(failed))

    def finish(self, groups: Sequence[Sequence[dict]]) -> tuple[list[float], dict[str, Any]]:
        """Every prompt's samples (`groups`, in prompt order) scored -> their rewards in the same order (prompt by
        prompt) and the batch's reward stats (none for a shipped reward)."""
        generated = max((at for _, _, at in self.answers), default=time.time())
        for prompt, outputs in enumerate(groups):
            if prompt not in self.submitted:
                self._submit(prompt, outputs)
        results = self.scorer.collect()
        offsets = [0]
        for outputs in groups:
            offsets.append(offsets[-1] + len(outputs))
        placed: dict[int, RewardResult] = {}
        for (prompt, sample), result in zip(self.order, results, strict=True):
            placed[offsets[prompt] + sample] = result
        done = [placed[index] for index in range(offsets[-1])]
        failed = [(key, result) for key, result in zip(self.order, results, strict=True) if result.failure]
        if failed:
            self._failures(failed)
        if isinstance(self.spec, str):
            return [result.score for result in done], {}
        if self.timeline:
            self._write_timeline(generated, results)
        return [result.score for result in done], self._stats(done, generated, len(failed))

    def _failures(self, failed: list[tuple[tuple[int, int], RewardResult]]) -> None:
        """Only a function's calls fail one by one (a server's failure stops the job in collect)."""
        assert isinstance(self.spec, EngineRewardFunction)
        who = describe(self.spec.code)
        (prompt, sample), result = failed[0]
        if self.spec.on_error == "stop":
            raise RewardFunctionError(
                f"{who} failed on {self._where(prompt, sample)}: {result.failure}; fix the function, or set "
                "grpo.reward.on_error: default to give such samples grpo.reward.default_score."
            )
        if self.logs_dir is not None:
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            with (self.logs_dir / FAILURES_FILE).open("a") as handle:
                for (prompt, sample), result in failed:
                    row = {
                        "step": self.step,
                        "sample": self._where(prompt, sample),
                        "failure": result.failure,
                        "score": result.score,
                        "response": self.responses[(prompt, sample)],
                    }
                    handle.write(json.dumps(row) + "\n")
        for (prompt, sample), result in failed[:NAMED_FAILURES]:
            self.log(
                f"step {self.step}: {who} failed on {self._where(prompt, sample)} ({result.failure}); it scores "
                f"{result.score:g} (grpo.reward.on_error: default)"
            )
        if len(failed) > NAMED_FAILURES:
            self.log(
                f"step {self.step}: {len(failed) - NAMED_FAILURES} more sample(s) failed the same way; "
                f"logs/{FAILURES_FILE} lists every one with its response"
            )

    def _where(self, prompt: int, sample: int) -> str:
        return f"{self.dataset} line {self.records[prompt].line}, sample {sample + 1}"

    def _stats(self, results: list[RewardResult], generated: float, failures: int) -> dict[str, Any]:
        overlap = sum(max(0.0, min(result.finished, generated) - max(result.started, self.began)) for result in results)
        last = max((result.finished for result in results), default=generated)
        stats: dict[str, Any] = {
            "reward_failures": failures,
            "reward_overlap_seconds": overlap,
            "reward_wait_seconds": max(0.0, last - generated),
        }
        sums: dict[str, list[float]] = {}
        for result in results:
            for name, value in result.metrics.items():
                sums.setdefault(name, []).append(value)
        stats["reward_metrics"] = {name: sum(values) / len(values) for name, values in sums.items()}
        return stats

    def _write_timeline(self, generated: float, results: list[RewardResult]) -> None:
        def since(moment: float) -> float:
            return round(moment - self.began, 4)

        row = {
            "step": self.step,
            "generation_began": round(self.began, 4),  # wall clock; every other time is seconds after it
            "generation_finished": since(generated),
            "answers": [{"prompts": [start, start + count], "at": since(at)} for start, count, at in self.answers],
            "samples": [
                {
                    "prompt": prompt,
                    "sample": sample,
                    "submitted": since(result.submitted),
                    "started": since(result.started),
                    "finished": since(result.finished),
                    "failed": result.failure is not None,
                }
                for (prompt, sample), result in zip(self.order, results, strict=True)
            ],
        }
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with (self.logs_dir / TIMELINE_FILE).open("a") as handle:
            handle.write(json.dumps(row) + "\n")
