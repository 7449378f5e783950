"""The RL prompt dataset: a local jsonl file, one `{"prompt": ..., "answer": ...}` object a line.

The prompt is a string or a chat (a list of `{"role": ..., "content": ...}` messages, for a chat template);
the answer is the reference a reward compares against (numbers are taken as their text). Blank lines are
skipped; anything else that is not such an object is an error naming the file and line. Every other field of a
line travels with its record (`fields`: the whole object), for a reward function or an environment of the user's;
those need no answer (`needs_answer=False`), and an environment, which starts the conversation itself, no prompt
either (`needs_prompt=False`). The file is read a line at a time through files.read_jsonl, which refuses what no
line of a dataset is (bytes that are not UTF-8, JSON nested past any record, an integer of thousands of digits, a
string holding a lone surrogate that no tokenizer takes) with the same sentence.

Order: each epoch is a fresh seeded permutation of the records, cut into rollout batches of
`prompts_per_step`. The few records left over at an epoch's end are skipped for that epoch only (the next
permutation puts other records last), so no batch repeats a prompt. Step s is therefore a pure function of
(seed, s): a job resumed at step s gets exactly the batches the interrupted one would have. Dynamic sampling's
further prompts (`draw`) are a function of (seed, step, round) too.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gdnctl.errors import GdnctlError
from gdnctl.files import MIB, UnreadableFile, read_jsonl

Prompt = str | tuple[dict[str, str], ...]
# A record is a prompt and its answer: a few KiB, a long chat some hundreds. Past this a line is no record.
MAX_RECORD_BYTES = 64 * MIB


class PromptDatasetError(GdnctlError):
    """The prompt dataset cannot be read or a line of it is not a prompt record."""


@dataclass(frozen=True)
class PromptRecord:
    prompt: Prompt | None  # None only where the dataset needs none (an environment starts the conversation)
    answer: str  # "" where the dataset needs none and the line has none
    line: int  # 1-based line in the file, for messages about this record
    fields: dict[str, Any] = field(default_factory=dict, compare=False)  # the line's whole JSON object


@dataclass(frozen=True)
class RolloutBatch:
    step: int
    epoch: int
    records: tuple[PromptRecord, ...]


def _parse_prompt(value: Any, where: str, key: str) -> Prompt:
    if isinstance(value, str) and value.strip():
        return value
    if (
        isinstance(value, list)
        and value
        and all(
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
            for message in value
        )
    ):
        return tuple(value)
    raise PromptDatasetError(
        f'{where}: \'{key}\' must be a non-empty string or a list of {{"role": ..., "content": ...}} messages.'
    )


def _parse_answer(value: Any, where: str, key: str) -> str:
    # bool is an int subclass, but true/false is no reference answer a math reward can check.
    if isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
        return str(value)
    raise PromptDatasetError(f"{where}: '{key}' must be a string or a number, not {type(value).__name__}.")


def load_prompts(
    path: str | Path,
    *,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    needs_prompt: bool = True,
    needs_answer: bool = True,
) -> list[PromptRecord]:
    """Every record of the jsonl file at `path`, in file order; PromptDatasetError on the first bad line. A field
    the job does not need may be missing; where it is there, it is read as a needed one is."""
    path = Path(path)
    records = []
    needed = [key for key, need in ((prompt_key, needs_prompt), (answer_key, needs_answer)) if need]
    try:
        for number, item in read_jsonl(path, MAX_RECORD_BYTES):
            records.append(_record(item, f"{path} line {number}", number, prompt_key, answer_key, needed))
    except UnreadableFile as error:
        raise PromptDatasetError(
            f"The prompt dataset {error}; point train.data_path at a UTF-8 jsonl file of one JSON object a line."
        ) from None
    if not records:
        raise PromptDatasetError(f"The prompt dataset {path} has no records; it needs one JSON object per line.")
    return records


def _record(item: Any, where: str, number: int, prompt_key: str, answer_key: str, needed: list[str]) -> PromptRecord:
    if not isinstance(item, dict):
        raise PromptDatasetError(f"{where}: expected a JSON object, got {type(item).__name__}.")
    missing = [key for key in needed if key not in item]
    if missing:
        fields = ", ".join(map(repr, item)) or "none"
        raise PromptDatasetError(
            f"{where}: no '{missing[0]}' field (it has {fields}); set the dataset's "
            "prompt/answer field names to the ones it uses."
        )
    return PromptRecord(
        _parse_prompt(item[prompt_key], where, prompt_key) if prompt_key in item else None,
        _parse_answer(item[answer_key], where, answer_key) if answer_key in item else "",
        number,
        item,
    )


class PromptSchedule:
    """Which prompts each RL step rolls out: `batch(step)` for one step, `batches(start_step)` to iterate."""

    def __init__(self, records: Sequence[PromptRecord], prompts_per_step: int, *, seed: int = 0) -> None:
        if prompts_per_step < 1 or len(records) < prompts_per_step:
            raise PromptDatasetError(
                f"prompts_per_step is {prompts_per_step} but the dataset has {len(records)} "
                "records; it must be between 1 and the number of records."
            )
        self.records = tuple(records)
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self.steps_per_epoch = len(self.records) // prompts_per_step
        self._epoch_order: tuple[int, list[int]] | None = None

    def _permutation(self, epoch: int) -> list[int]:
        # Steps walk the epochs in order, so remembering the latest permutation is all the caching needed.
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            # A string seed goes through sha512 in random.seed: stable across processes and Python versions,
            # unlike hash(), and distinct for every (seed, epoch) pair.
            order = list(range(len(self.records)))
            random.Random(f"gdnctl-prompts:{self.seed}:{epoch}").shuffle(order)
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]

    def batch(self, step: int) -> RolloutBatch:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}.")
        epoch, index = divmod(step, self.steps_per_epoch)
        start = index * self.prompts_per_step
        chosen = self._permutation(epoch)[start : start + self.prompts_per_step]
        return RolloutBatch(step, epoch, tuple(self.records[i] for i in chosen))

    def draw(self, step: int, round_: int, count: int, used: frozenset[int]) -> tuple[PromptRecord, ...]:
        """`count` further prompts for step `step`'s dynamic-sampling round `round_` (>= 1): the first of a seeded
        permutation of the dataset, a function of (seed, step, round), past the lines the step has used already.
        Fewer when the dataset runs out."""
        order = list(range(len(self.records)))
        random.Random(f"gdnctl-prompts-extra:{self.seed}:{step}:{round_}").shuffle(order)
        fresh = (self.records[i] for i in order if self.records[i].line not in used)
        return tuple(record for record, _ in zip(fresh, range(count), strict=False))

    def batches(self, start_step: int = 0, stop_step: int | None = None) -> Iterator[RolloutBatch]:
        """Batches for steps start_step, start_step + 1, ... up to stop_step (exclusive; None: forever). A job
        resuming after N finished steps passes start_step=N."""
        step = start_step
        while stop_step is None or step < stop_step:
            yield self.batch(step)
            step += 1
