"""Python's collector between training steps (runtime/train/gc_policy.py): off inside a step, run every interval
and on demand, and put back as it was afterwards, also when the job fails; none at all while the trainer sets up."""

from __future__ import annotations

import gc

import pytest

from gdnctl.runtime.train.gc_policy import collector_between_steps, no_collection


@pytest.fixture
def collections():
    """Counts the collections Python starts (gc.callbacks sees each one begin)."""
    seen = []

    def callback(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(callback)
    yield seen
    gc.callbacks.remove(callback)


def test_automatic_collection_is_off_while_training_and_back_afterwards():
    assert gc.isenabled()
    with collector_between_steps(100):
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0  # what was built before training is out of every later collection
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_collects_every_interval_steps_and_after_a_save(collections):
    with collector_between_steps(3) as collector:
        collections.clear()
        for step in range(1, 8):
            collector.after_step(step)
        assert len(collections) == 2  # steps 3 and 6
        collector.collect()  # after a save
        assert len(collections) == 3


def test_interval_zero_leaves_python_as_it_is(collections):
    with collector_between_steps(0) as collector:
        assert gc.isenabled()
        collections.clear()
        collector.after_step(100)
        collector.collect()
        assert collections == []


def test_interval_zero_collects_as_usual_in_the_steps_after_a_set_up_without_collection():
    with no_collection():
        with collector_between_steps(0):
            assert gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_after_a_set_up_without_collection_the_steps_collect_once_before_they_start(collections):
    with no_collection():
        collections.clear()
        with collector_between_steps(10):
            assert collections == [2]  # one full collection: what set-up left
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_failing_job_still_gets_its_collector_back():
    with pytest.raises(RuntimeError), collector_between_steps(10):
        raise RuntimeError("step failed")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_set_up_starts_no_collection_and_gives_it_back(collections):
    with no_collection():
        collections.clear()
        kept = []
        for _ in range(50_000):  # far past the young generation's 700: a collection would have started
            cycle: list = []
            cycle.append(cycle)
            kept.append(cycle)
        assert collections == []
    assert gc.isenabled()


def test_set_up_that_fails_still_gives_collection_back():
    with pytest.raises(RuntimeError), no_collection():
        raise RuntimeError("model build failed")
    assert gc.isenabled()
