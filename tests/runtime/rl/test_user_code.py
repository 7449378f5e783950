"""Importing the user's code a preset names (runtime/rl/user_code.py), and reading the scores it returns."""

from __future__ import annotations

import math

import pytest

from gdnctl.runtime.rl.user_code import ScoreError, UserCodeError, load, read_score


def code(file=None, module=None, name="score") -> dict:
    return {
        "field": "grpo.reward.function",
        "file": None if file is None else str(file),
        "module": module,
        "name": name,
    }


def test_a_file_is_imported_with_the_helpers_beside_it(tmp_path):
    (tmp_path / "helpers_for_rewards.py").write_text("BONUS = 0.5\n")
    (tmp_path / "rewards.py").write_text("from helpers_for_rewards import BONUS\ndef score(**kw):\n    return BONUS\n")
    assert load(code(tmp_path / "rewards.py"))() == 0.5


def test_a_module_is_imported_from_the_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_pkg").mkdir()
    (tmp_path / "my_rewards_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_rewards_pkg" / "score.py").write_text("def score(**kw):\n    return 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load(code(module="my_rewards_pkg.score"))() == 2


@pytest.mark.parametrize(
    "source, said",
    [
        (None, "is not a file here"),
        ("def score(:\n", "rewards.py:1: invalid syntax; fix the syntax."),
        ("raise RuntimeError('no GPU here')\n", "importing {path} failed: RuntimeError: no GPU here (rewards.py:1)"),
        ("def scroe(**kw):\n    return 1\n", "the module defines no score"),
    ],
)
def test_code_that_cannot_be_loaded_is_a_sentence_naming_the_field(tmp_path, source, said):
    path = tmp_path / "rewards.py"
    if source is not None:
        path.write_text(source)
    with pytest.raises(UserCodeError) as caught:
        load(code(path))
    assert str(caught.value).startswith(f"grpo.reward.function {path}:score: ")
    assert said.format(path=path) in str(caught.value)


def test_a_missing_module_says_to_install_it_or_name_the_file():
    with pytest.raises(UserCodeError, match="no module no_such_pkg_anywhere on the trainer's Python path"):
        load(code(module="no_such_pkg_anywhere.rewards"))


@pytest.mark.parametrize(
    "value, read",
    [
        (1, (1.0, {})),
        (True, (1.0, {})),
        (0.25, (0.25, {})),
        ({"score": 0.5, "passed": 3}, (0.5, {"passed": 3.0})),
    ],
)
def test_a_score_is_a_finite_number_or_a_mapping_with_one(value, read):
    assert read_score(value) == read


@pytest.mark.parametrize(
    "value, said",
    [
        (math.nan, "it is nan, not a finite number"),
        (math.inf, "it is inf, not a finite number"),
        ("1.0", "it is str '1.0', not a number"),
        (None, "it is NoneType None, not a number"),
        ({"passed": 3}, "it returned a mapping without a 'score' (keys: passed)"),
        ({"score": 1, "time": math.nan}, "its 'time' is nan, not a finite number"),
    ],
)
def test_anything_else_is_no_score(value, said):
    with pytest.raises(ScoreError) as caught:
        read_score(value)
    assert str(caught.value) == said
