"""Python's garbage collector between training steps instead of inside them, and not at all while the trainer
sets up.

A full collection walks every tracked object: in a trainer that holds a built model, Megatron's buffers and
thousands of autograd nodes it takes tens of milliseconds, and CPython starts one whenever allocations cross its
thresholds, so it lands in a random step and stalls the host thread that launches the GPU's work. Megatron-LM's
`--manual-gc` does the same as this (megatron/training/training.py: `gc.disable()`, `gc.collect()` every
`manual_gc_interval` steps).

Set-up (Megatron-Core's, Transformer Engine's and megatron-bridge's imports, the model build) creates hundreds of
thousands of objects that live for the whole job and almost no garbage, yet each 700 new objects start a young
collection and a growing heap starts full ones that walk everything built so far again: work that frees nothing.
The trainer turns automatic collection off from its set-up until its steps start; the collection before the
first step (or Python's own, where steps collect as usual) finds whatever set-up left.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


class StepCollector:
    """Collects every `interval` steps (and when told to, after a save); interval 0: Python collects as usual."""

    def __init__(self, interval: int) -> None:
        self.interval = interval

    def after_step(self, step: int) -> None:
        if self.interval and step % self.interval == 0:
            self.collect()

    def collect(self) -> None:
        if self.interval:
            gc.collect()


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """Automatic collection off inside, and back as it was afterwards, whatever happened inside."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def collector_between_steps(interval: int) -> Iterator[StepCollector]:
    """While training: automatic collection off and the objects built so far frozen out of every later
    collection (the model and its buffers live for the whole job), when `interval` > 0; with 0, Python collects
    as usual (also where set-up had turned it off). The collector's state is put back afterwards, whatever
    happened inside."""
    collector = StepCollector(interval)
    was_enabled = gc.isenabled()
    if interval:
        gc.collect()  # what set-up left, once
        gc.freeze()
        gc.disable()
    else:
        gc.enable()
    try:
        yield collector
    finally:
        if interval:
            gc.unfreeze()
        if was_enabled:
            gc.enable()
        else:
            gc.disable()
