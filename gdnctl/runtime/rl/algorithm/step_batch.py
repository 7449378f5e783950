"""One step's batch as its samples arrive: which requests it needs, its groups as they complete, DAPO's dynamic
sampling, the staleness bound, and the samples to train on once it is whole. Engine-free: the loop (runtime/rl/feed.py)
sends the requests, scores each finished sample (its reward is set when it arrives here) and asks when the batch is
ready.

A step's prompts are its schedule's (round 0); each gets n samples, one request each (`Request`: its seed from
sampling.sample_seed, so the draw is a function of (seed, step)). Without dynamic sampling the batch is whole when
every group is. With it (grpo.dynamic_sampling), a completed group whose rewards are all equal carries no advantage
and is dropped; once every group of a round has completed and fewer than the step's prompts' worth were kept, a
further round draws that many more prompts (the `draw` callback: a function of (seed, step, round)); after
max_rounds, what is still missing is filled with dropped groups that take no loss, so the batch keeps its size
(train.global_batch_size, which the data-parallel split and the mini-batches divide).

Staleness: a sample whose oldest token is more than max_staleness versions behind the step's policy is never
trained on; it is dropped and its request sent again (a new attempt, under newer weights).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from gdnctl.runtime.rl.algorithm import grpo, sampling
from gdnctl.runtime.rl.algorithm.batch import Sample


@dataclass(frozen=True)
class Request:
    """One sample to generate: the step, round, prompt slot and sample index it fills, and its seed."""

    step: int
    round: int
    slot: int  # the prompt's place among the step's prompts, every round's counted
    index: int  # the sample's place in its group
    prompt: tuple[int, ...]
    seed: int
    attempt: int = 0  # > 0: sent again (a stale sample regenerated)

    @property
    def id(self) -> str:
        tail = f".a{self.attempt}" if self.attempt else ""
        return f"s{self.step}.r{self.round}.p{self.slot}.n{self.index}{tail}"


@dataclass(eq=False)  # a group is itself: compared by identity
class _Group:
    record: object  # the prompt record (prompts/dataset.PromptRecord); its `line` names it
    slot: int
    round: int
    prompt: tuple[int, ...]
    samples: dict[int, Sample] = field(default_factory=dict)


@dataclass(frozen=True)
class StepStats:
    """What the step's sampling did, for its metrics row."""

    rounds: int  # generation rounds that ran (1 without dynamic sampling)
    dropped_groups: int  # groups whose rewards were all equal, left out of the loss (dynamic sampling)
    filler_groups: int  # of those, kept in the batch without loss because the rounds ran out
    stale_regenerated: int  # samples more than max_staleness versions old, dropped and generated again
    prompt_lines: tuple[int, ...]  # the trained groups' prompt lines, in batch order


class StepBatch:
    def __init__(
        self,
        step: int,
        records: Sequence,
        encode: Callable[[object], Sequence[int]],
        *,
        n: int,
        seed: int,
        max_rounds: int,
        max_staleness: int,
        draw: Callable[[int, int, int, frozenset[int]], Sequence] | None = None,
    ) -> None:
        """records: the step's own prompts (round 0); encode: a record's prompt token ids; draw(step, round,
        count, lines already used) -> that many further records, for dynamic sampling (max_rounds > 1)."""
        self.step, self.n, self.seed = step, n, seed
        self.wanted = len(records)
        self.max_rounds, self.max_staleness = max_rounds, max_staleness
        self._encode, self._draw = encode, draw
        self.groups: list[_Group] = []
        self.rounds = 0
        self.stale_regenerated = 0
        self._open: list[Request] = self._add_round(records)

    @property
    def dynamic(self) -> bool:
        return self.max_rounds > 1

    def record_of(self, slot: int):
        """The record of the prompt in `slot` (every round's slots counted)."""
        return self.groups[slot].record

    def take_requests(self) -> list[Request]:
        """The requests this batch needs that have not been handed out yet."""
        out, self._open = self._open, []
        return out

    def _add_round(self, records: Sequence) -> list[Request]:
        requests = []
        for record in records:
            slot = len(self.groups)
            group = _Group(record, slot, self.rounds, tuple(self._encode(record)))
            self.groups.append(group)
            requests += [
                Request(self.step, self.rounds, slot, index, group.prompt, self._seed(self.rounds, slot, index))
                for index in range(self.n)
            ]
        self.rounds += 1
        return requests

    def _seed(self, round_: int, slot: int, index: int, attempt: int = 0) -> int:
        return sampling.sample_seed(self.seed, self.step, round_, slot, index, attempt)

    def add(self, request: Request, sample: Sample) -> None:
        """A finished sample of `request`, its reward set. A sample past the staleness bound is dropped and its
        request sent again; a round that completes short of the batch starts the next."""
        version = sample.version
        if version is not None and sampling.too_stale(self.step, version, self.max_staleness):
            self.stale_regenerated += 1
            attempt = request.attempt + 1
            seed = self._seed(request.round, request.slot, request.index, attempt)
            self._open.append(replace(request, attempt=attempt, seed=seed))
            return
        group = self.groups[request.slot]
        group.samples[request.index] = sample
        if self.dynamic and self._round_done(self.rounds - 1):
            missing = self.wanted - len(self._kept())
            if missing > 0 and self.rounds < self.max_rounds:
                used = frozenset(g.record.line for g in self.groups)
                self._open += self._add_round(self._draw(self.step, self.rounds, missing, used))

    def _round_done(self, round_: int) -> bool:
        return all(len(g.samples) == self.n for g in self.groups if g.round == round_)

    def _complete(self, group: _Group) -> bool:
        return len(group.samples) == self.n

    def _uniform(self, group: _Group) -> bool:
        return sampling.uniform([s.reward for s in group.samples.values()])

    def _kept(self) -> list[_Group]:
        return [g for g in self.groups if self._complete(g) and not (self.dynamic and self._uniform(g))]

    @property
    def ready(self) -> bool:
        """Whether the batch is whole: every group complete, and with dynamic sampling, either enough kept or the
        rounds spent with every group of the last round complete."""
        if not self.dynamic:
            return all(self._complete(g) for g in self.groups) and not self._open
        if self._open or not self._round_done(self.rounds - 1):
            return False
        return len(self._kept()) >= self.wanted or self.rounds >= self.max_rounds

    def round_zero_rewards(self) -> list[float]:
        """The rewards of the step's own prompts' samples (round 0): the policy's reward on the step's prompts,
        unbiased by the dynamic-sampling filter."""
        return [s.reward for g in self.groups if g.round == 0 for s in g.samples.values()]

    def samples(self, *, normalize_std: bool) -> tuple[list[Sample], StepStats]:
        """The batch to train on, groups in (round, slot) order with their advantages, and what sampling did."""
        if not self.ready:
            raise RuntimeError(f"step {self.step}'s batch is not complete yet")
        kept = self._kept()[: self.wanted]
        dropped = [g for g in self.groups if self._complete(g) and g not in self._kept()]
        fillers = dropped[: self.wanted - len(kept)]
        batch: list[Sample] = []
        for number, group in enumerate(kept + fillers):
            trained = group not in fillers
            for index in range(self.n):
                sample = group.samples[index]
                batch.append(replace(sample, group=number, trained=sample.trained and trained))
        rewards = torch.tensor([s.reward for s in batch], dtype=torch.float64)
        advantages = grpo.group_advantages(rewards, self.n, normalize_std=normalize_std)
        batch = [replace(s, advantage=float(a)) for s, a in zip(batch, advantages, strict=True)]
        stats = StepStats(
            rounds=self.rounds,
            dropped_groups=len(dropped) if self.dynamic else 0,
            filler_groups=len(fillers),
            stale_regenerated=self.stale_regenerated,
            prompt_lines=tuple(g.record.line for g in kept + fillers),
        )
        return batch, stats
