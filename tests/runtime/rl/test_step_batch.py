"""One step's batch as its samples arrive (algorithm/step_batch.py) and the sampling rules it rests on
(algorithm/sampling.py): independent seeds that are a function of (seed, step), DAPO's dynamic sampling and
over-long penalty, the staleness bound."""

from __future__ import annotations

import pytest

from gdnctl.runtime.rl.algorithm import Sample, StepBatch, sampling
from gdnctl.runtime.rl.algorithm.batch import build_batch
from gdnctl.runtime.rl.prompts.dataset import PromptRecord, PromptSchedule

N = 4


def records(count: int) -> list[PromptRecord]:
    return [PromptRecord(f"q{index}", str(index), index + 1) for index in range(count)]


def encode(record: PromptRecord) -> list[int]:
    return [record.line, 7]


def batch_of(step: int = 0, *, max_rounds: int = 1, max_staleness: int = 0, prompts: int = 3) -> StepBatch:
    schedule = PromptSchedule(records(12), prompts, seed=11)
    return StepBatch(
        step,
        schedule.batch(step).records,
        encode,
        n=N,
        seed=11,
        max_rounds=max_rounds,
        max_staleness=max_staleness,
        draw=schedule.draw,
    )


def sample(request, reward: float, version: int = 0, finish: str = "stop") -> Sample:
    return Sample(request.slot, request.prompt, (1, 2), (-0.5, -0.5), finish, reward, versions=(version, version))


def test_every_sample_of_a_step_has_its_own_seed_and_the_draw_is_a_function_of_seed_and_step():
    requests = batch_of(3).take_requests()
    assert len(requests) == 3 * N and len({r.seed for r in requests}) == 3 * N
    assert [r.seed for r in requests] == [r.seed for r in batch_of(3).take_requests()]
    assert not {r.seed for r in requests} & {r.seed for r in batch_of(4).take_requests()}
    # Sample j of prompt i never shares sample j - 1 of prompt i + 1's noise, as seed + index seeding would.
    assert sampling.sample_seed(1, 0, 0, 0, 1) != sampling.sample_seed(1, 0, 0, 1, 0)
    assert all(0 <= r.seed < 2**sampling.SEED_BITS for r in requests)


def test_a_batch_is_whole_once_every_group_is_and_carries_group_advantages():
    batch = batch_of()
    requests = batch.take_requests()
    for index, request in enumerate(requests):
        assert not batch.ready
        batch.add(request, sample(request, reward=float(index % N == 0)))
    assert batch.ready
    samples, stats = batch.samples(normalize_std=False)
    assert [s.group for s in samples] == [0] * N + [1] * N + [2] * N
    assert [s.advantage for s in samples[:N]] == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert (
        stats.rounds == 1
        and stats.dropped_groups == 0
        and stats.prompt_lines == tuple(g.record.line for g in batch.groups)
    )


def test_dynamic_sampling_drops_uniform_groups_draws_more_and_fills_with_untrained_ones_when_rounds_run_out():
    batch = batch_of(max_rounds=2)
    first = batch.take_requests()
    for request in first:  # group 0 learns something, groups 1 and 2 are uniform
        batch.add(request, sample(request, reward=float(request.slot == 0 and request.index == 0)))
    assert not batch.ready
    second = batch.take_requests()
    assert {r.round for r in second} == {1} and len(second) == 2 * N  # two groups missing: two more prompts
    assert not {r.prompt[0] for r in second} & {r.prompt[0] for r in first}
    assert [r.seed for r in second] == [r.seed for r in _second_round_again(max_rounds=2)]  # (seed, step, round)
    for request in second:  # one of the two new groups is uniform again, and the rounds are spent
        batch.add(request, sample(request, reward=float(request.slot == 3 and request.index == 1)))
    assert batch.ready
    samples, stats = batch.samples(normalize_std=True)
    assert stats.rounds == 2 and stats.dropped_groups == 3 and stats.filler_groups == 1
    assert len(samples) == 3 * N
    trained = [s.trained for s in samples]
    assert trained == [True] * 2 * N + [False] * N  # the filler group keeps the batch's size but takes no loss
    assert all(s.advantage == 0 for s in samples[2 * N :])


def _second_round_again(max_rounds: int):
    """The second round's requests of the same step, drawn anew the same way."""
    batch = batch_of(max_rounds=max_rounds)
    for request in batch.take_requests():
        batch.add(request, sample(request, reward=float(request.slot == 0 and request.index == 0)))
    return batch.take_requests()


def test_a_sample_past_the_staleness_bound_is_never_trained_but_generated_again():
    batch = batch_of(step=5, max_staleness=1)
    requests = batch.take_requests()
    stale = requests[0]
    batch.add(stale, sample(stale, reward=1.0, version=3))  # 2 versions behind the step's policy (5)
    again = batch.take_requests()
    assert [(r.slot, r.index, r.attempt) for r in again] == [(stale.slot, stale.index, 1)]
    assert again[0].seed != stale.seed
    for request in [*requests[1:], *again]:
        batch.add(request, sample(request, reward=float(request.index), version=4))
    samples, stats = batch.samples(normalize_std=True)
    assert stats.stale_regenerated == 1
    assert all(s.version == 4 for s in samples)


def test_dapos_overlong_penalty_grows_linearly_over_the_buffer():
    penalty = [sampling.overlong_penalty(length, 100, 20, 1.0) for length in (10, 80, 90, 100, 120)]
    assert penalty == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])


def test_a_sample_that_takes_no_loss_keeps_its_row_with_an_empty_response_mask():
    kept = Sample(0, (5, 6), (7, 8), (-0.1, -0.2), "stop", 1.0)
    masked = Sample(0, (5, 6), (7, 8, 9), (-0.1, -0.2, -0.3), "length", 0.0, trained=False)
    rows = build_batch([kept, masked], pad_id=0)
    assert rows.tokens.shape == (2, 5)
    assert rows.response_mask[0].sum() == 2 and rows.response_mask[1].sum() == 0
    assert rows.num_response_tokens == 2
