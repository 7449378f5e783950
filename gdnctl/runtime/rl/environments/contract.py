"""The contract of a multi-turn environment (rollout.environment.class): what the user's class implements, and how
the rollout reads what it returns. Standard library only; the class need not import anything of gdnctl's
(subclassing `Environment` is optional, for the documentation and the default limit_reward).

    class Env:                                  # one instance per episode
        def __init__(self, record): ...         # the dataset line's whole JSON object
        def start(self):                        # the conversation's opening messages
            return [{"role": "user", "content": "What is 24 + 48?"}]
        def step(self, response):               # the model's turn, decoded (special tokens left out)
            return [{"role": "tool", "content": "72"}]   # observations: the episode goes on
            return 1.0                          # or its reward: the episode ends (a number, or a mapping with
                                                #  "score" and other numbers, reported as reward/NAME metrics)
        def limit_reward(self):                 # optional: the reward of an episode cut short before it ended
            return 0.0                          #  (rollout.environment.max_turns, or the rollout's context)

start may return a string: one user message. Messages are {"role": ..., "content": ...} with string values, as
the tokenizer's chat template takes them; an observation's role is whatever the template knows ("tool", "user").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.user_code import ScoreError, read_score


class EnvironmentFailure(GdnctlError):
    """The user's environment failed, or returned what the contract does not allow."""

    exit_code = 1


class Environment:
    """A base the user's class may take: the record kept as `self.record`, and no reward for a cut episode."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def start(self) -> list[dict[str, str]] | str:
        raise NotImplementedError("an environment's start() returns the conversation's opening messages")

    def step(self, response: str) -> list[dict[str, str]] | float | Mapping[str, float]:
        raise NotImplementedError("an environment's step() returns observation messages or the episode's reward")

    def limit_reward(self) -> float:
        return 0.0


@dataclass(frozen=True)
class Observation:
    """step() returned messages: the episode goes on."""

    messages: tuple[dict[str, str], ...]


@dataclass(frozen=True)
class Ending:
    """step() returned a reward: the episode ends."""

    score: float
    metrics: dict[str, float] = field(default_factory=dict)


def read_messages(value: Any, who: str, method: str) -> tuple[dict[str, str], ...]:
    """Chat messages from what `method` returned (a string is one user message); the sentence otherwise."""
    if isinstance(value, str):
        return ({"role": "user", "content": value},)
    if (
        isinstance(value, Sequence)
        and value
        and all(
            isinstance(message, Mapping)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
            for message in value
        )
    ):
        return tuple({"role": message["role"], "content": message["content"]} for message in value)
    raise EnvironmentFailure(
        f"{who}: {method} returned {type(value).__name__} {_short(value)}; it returns a non-empty list of "
        '{"role": ..., "content": ...} messages with string values'
        + (" (or a string)" if method == "start()" else "")
        + "."
    )


def read_step(value: Any, who: str) -> Observation | Ending:
    """What step() returned: observations to answer the model with, or the episode's reward."""
    if isinstance(value, (list, tuple, str)):
        if isinstance(value, str):
            raise EnvironmentFailure(
                f"{who}: step() returned a string; it returns a list of messages (observations) or a number "
                "(the episode's reward)."
            )
        return Observation(read_messages(value, who, "step()"))
    try:
        score, metrics = read_score(value)
    except ScoreError as error:
        raise EnvironmentFailure(
            f"{who}: step() ended the episode with a reward that is not one: {error}; return a finite number, or "
            'a mapping with one under "score" (or a list of messages to go on).'
        ) from None
    return Ending(score, metrics)


def read_limit_reward(value: Any, who: str) -> Ending:
    try:
        score, metrics = read_score(value)
    except ScoreError as error:
        raise EnvironmentFailure(
            f"{who}: limit_reward() returned no reward: {error}; return a finite number."
        ) from None
    return Ending(score, metrics)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
