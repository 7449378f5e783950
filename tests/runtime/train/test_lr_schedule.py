"""The lr schedule (runtime/train/lr_schedule.py): a pure function of the step, so a resume continues it."""

from __future__ import annotations

import itertools
import math

import pytest

from gdnctl.runtime.train.lr_schedule import lr_at


def schedule(decay: str, **overrides) -> list[float]:
    settings = {"lr": 1.0, "warmup_steps": 4, "decay": decay, "min_lr": 0.1, "total_steps": 14} | overrides
    return [lr_at(step, **settings) for step in range(settings["total_steps"])]


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_the_warmup_rises_linearly_from_lr_over_warmup_and_its_first_step_already_moves(decay):
    assert schedule(decay)[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_cosine_falls_from_lr_to_min_lr_over_the_steps_after_the_warmup():
    lrs = schedule("cosine")
    decayed = lrs[4:]
    assert decayed == sorted(decayed, reverse=True)
    # Halfway through the decay (5 of 10 steps) the cosine is at the midpoint of lr and min_lr.
    assert lrs[9] == pytest.approx(0.55)
    assert lrs[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 9 / 10)))
    assert lr_at(14, lr=1.0, warmup_steps=4, decay="cosine", min_lr=0.1, total_steps=14) == pytest.approx(0.1)


def test_linear_falls_by_the_same_amount_every_step():
    lrs = schedule("linear")
    assert [round(a - b, 9) for a, b in itertools.pairwise(lrs[4:])] == [0.09] * 9
    assert lrs[-1] == pytest.approx(0.19)


def test_constant_stays_at_lr_after_the_warmup_and_no_warmup_starts_at_lr():
    assert schedule("constant")[4:] == [1.0] * 10
    assert schedule("cosine", warmup_steps=0)[0] == 1.0


def test_a_resumed_job_gets_the_lr_the_uninterrupted_one_would_have():
    whole = schedule("cosine")
    resumed_at = 7
    assert [
        lr_at(step, lr=1.0, warmup_steps=4, decay="cosine", min_lr=0.1, total_steps=14)
        for step in range(resumed_at, 14)
    ] == whole[resumed_at:]


def test_an_unknown_decay_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="cosine, linear, constant"):
        lr_at(0, lr=1.0, warmup_steps=0, decay="step", min_lr=0.0, total_steps=10)
