"""The jsonl prompt dataset: parsing, one-sentence errors with file:line, seeded resumable rollout batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.prompts.dataset import PromptDatasetError, PromptRecord, PromptSchedule, load_prompts


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def records(count: int) -> list[PromptRecord]:
    return [PromptRecord(f"q{index}", str(index), index + 1) for index in range(count)]


def test_load_prompts_reads_strings_chats_and_numeric_answers(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    path = write_jsonl(
        tmp_path / "train.jsonl",
        [
            json.dumps({"prompt": "What is 6*7?", "answer": "42", "source": "gsm8k"}),
            "",
            json.dumps({"prompt": chat, "answer": 4}),
            json.dumps({"prompt": "Half of 1?", "answer": 0.5}),
        ],
    )
    loaded = load_prompts(path)
    assert loaded == [
        PromptRecord("What is 6*7?", "42", 1),
        PromptRecord(tuple(chat), "4", 3),
        PromptRecord("Half of 1?", "0.5", 4),
    ]


def test_field_names_are_configurable(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", [json.dumps({"problem": "1+1?", "solution": "2"})])
    assert load_prompts(path, prompt_key="problem", answer_key="solution") == [PromptRecord("1+1?", "2", 1)]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"prompt": "x", "answer": ', r"bad\.jsonl line 2 is not valid JSON"),
        ('["x", "1"]', r"bad\.jsonl line 2: expected a JSON object, got list\."),
        ('{"question": "x", "answer": "1"}', r"bad\.jsonl line 2: no 'prompt' field \(it has 'question', 'answer'\)"),
        ('{"prompt": "x"}', r"bad\.jsonl line 2: no 'answer' field"),
        ('{"prompt": "  ", "answer": "1"}', r"bad\.jsonl line 2: 'prompt' must be a non-empty string"),
        ('{"prompt": [{"role": "user"}], "answer": "1"}', r"bad\.jsonl line 2: 'prompt' must be .* messages"),
        ('{"prompt": "x", "answer": true}', r"bad\.jsonl line 2: 'answer' must be a string or a number, not bool\."),
        (
            '{"prompt": "x", "answer": null}',
            r"bad\.jsonl line 2: 'answer' must be a string or a number, not NoneType\.",
        ),
        (
            '{"prompt": "x", "answer": ' + "7" * 5001 + "}",
            r"bad\.jsonl line 2 is not usable JSON \(it holds an integer",
        ),
        ('{"prompt": "x\\ud800", "answer": "1"}', r"bad\.jsonl line 2 holds a lone surrogate escape \(\\ud800\)"),
    ],
)
def test_bad_lines_are_reported_with_file_and_line(tmp_path, bad_line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [json.dumps({"prompt": "ok", "answer": "1"}), bad_line])
    with pytest.raises(PromptDatasetError, match=message) as error:
        load_prompts(path)
    assert isinstance(error.value, GdnctlError) and str(error.value).count("\n") == 0


def test_every_field_travels_with_its_record_and_only_the_needed_ones_are_required(tmp_path):
    """A reward function of the user's needs no answer, an environment not even a prompt; whatever the line has
    reaches them as the record's fields."""
    path = write_jsonl(
        tmp_path / "tasks.jsonl",
        [json.dumps({"prompt": "Write f.", "tests": ["assert f() == 1"]}), json.dumps({"question": "2 + 3"})],
    )
    with pytest.raises(PromptDatasetError, match="no 'answer' field"):
        load_prompts(path)
    with pytest.raises(PromptDatasetError, match=r"tasks.jsonl line 2: no 'prompt' field"):
        load_prompts(path, needs_answer=False)
    first, second = load_prompts(path, needs_prompt=False, needs_answer=False)
    assert first.prompt == "Write f." and first.answer == "" and first.fields["tests"] == ["assert f() == 1"]
    assert second.prompt is None and second.fields == {"question": "2 + 3"} and second.line == 2


def test_missing_unreadable_and_empty_files(tmp_path):
    with pytest.raises(PromptDatasetError, match=r"The prompt dataset .*missing\.jsonl does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(PromptDatasetError, match=r"The prompt dataset .*latin1\.jsonl line 1 is not UTF-8 text"):
        load_prompts(tmp_path / "latin1.jsonl")
    with pytest.raises(PromptDatasetError, match=r"empty\.jsonl has no records"):
        load_prompts(write_jsonl(tmp_path / "empty.jsonl", ["", "  "]))


def test_each_epoch_is_a_seeded_permutation_cut_into_batches():
    schedule = PromptSchedule(records(10), 3, seed=7)
    assert schedule.steps_per_epoch == 3  # 10 // 3; one record sits out each epoch, a different one
    for epoch in range(4):
        batches = [schedule.batch(epoch * 3 + index) for index in range(3)]
        lines = [record.line for batch in batches for record in batch.records]
        assert len(lines) == len(set(lines)) == 9
        assert all(batch.epoch == epoch and len(batch.records) == 3 for batch in batches)
    epoch_orders = {tuple(r.line for s in range(e * 3, e * 3 + 3) for r in schedule.batch(s).records) for e in range(4)}
    assert len(epoch_orders) == 4


def test_order_depends_only_on_seed_and_step():
    first = [batch.records for batch in PromptSchedule(records(50), 8, seed=3).batches(0, 20)]
    again = [batch.records for batch in PromptSchedule(records(50), 8, seed=3).batches(0, 20)]
    other = [batch.records for batch in PromptSchedule(records(50), 8, seed=4).batches(0, 20)]
    assert first == again and first != other


def test_resuming_at_a_step_continues_the_same_sequence():
    schedule = PromptSchedule(records(23), 4, seed=1)
    uninterrupted = list(schedule.batches(0, 17))
    resumed = list(PromptSchedule(records(23), 4, seed=1).batches(start_step=9, stop_step=17))
    assert resumed == uninterrupted[9:]
    assert [batch.step for batch in resumed] == list(range(9, 17))
    assert PromptSchedule(records(23), 4, seed=1).batch(16) == uninterrupted[16]  # random access, any order


def test_schedule_rejects_impossible_batch_sizes():
    with pytest.raises(PromptDatasetError, match="prompts_per_step is 5 but the dataset has 4 records"):
        PromptSchedule(records(4), 5)
    with pytest.raises(PromptDatasetError, match="prompts_per_step is 0"):
        PromptSchedule(records(4), 0)
    with pytest.raises(ValueError, match="step must be >= 0"):
        PromptSchedule(records(4), 2).batch(-1)


def test_dynamic_samplings_further_prompts_are_a_function_of_seed_step_and_round_past_the_lines_used():
    schedule = PromptSchedule(records(20), 4, seed=3)
    used = frozenset(record.line for record in schedule.batch(5).records)
    drawn = schedule.draw(5, 1, 6, used)
    assert len(drawn) == 6 and not {record.line for record in drawn} & used
    assert len({record.line for record in drawn}) == 6
    assert drawn == PromptSchedule(records(20), 4, seed=3).draw(5, 1, 6, used)  # a resumed job draws the same
    assert drawn != schedule.draw(5, 2, 6, used) and drawn != schedule.draw(6, 1, 6, used)
    assert len(schedule.draw(5, 1, 50, used)) == 16  # the dataset runs out: fewer
