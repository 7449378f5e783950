"""Multi-turn episodes (rollout.environment): the user's environment and the model take turns, through the
rollout's engines and the tokenizer's chat template.

Each of a step's prompts becomes n episodes (rollout.n_samples_per_prompt), each with an instance of the user's
class made from the dataset record (environments/contract.py). The opening messages (start()) go through the
chat template with the assistant's turn opened; then, turn after turn, every live episode's whole conversation so
far goes to the engines in one generate request (token ids in, token ids and log-probs out: the engines' existing
request), at most rollout.max_response_tokens per turn. The model's turn, decoded, goes to step(), which answers
with observations, or ends the episode with its reward. An episode still going after
rollout.environment.max_turns model turns, or whose next turn would not fit the rollout's context
(rollout.max_model_len), is cut: its reward is limit_reward()'s, 0 when the class has none.

Tokens: the model's turns are kept as sampled (never re-tokenized). What the environment adds between two turns is
the text the chat template puts there: the rendering of the conversation with the observations and the next
assistant turn opened, past its rendering up to the model's turn closed, less the stop token the model already
wrote (so a model's <|im_end|> is not written twice). That text is encoded and appended, its tokens masked out of
the loss (Sample.loss_mask) with placeholder log-probs, as verl's tool agent loop masks a tool's tokens (volcengine/
verl, verl/experimental/agent_loop/tool_agent_loop.py: response_mask 0 on them; docs/sources.md). A
template that renders a model's earlier turn other than as the text it wrote (one that drops earlier reasoning)
cannot be continued this way; the sentence says so.

Every trainer rank takes part in each turn's generate request (a collective: engines other ranks drive need the
prompts); rank 0 runs the environments and shares each turn's prompts with the others (`share`), then an empty
list when every episode has ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.algorithm import Sample, Turn
from gdnctl.runtime.rl.algorithm import sampling as sample_seeds
from gdnctl.runtime.rl.environments import (
    Ending,
    EnvironmentFailure,
    Observation,
    read_limit_reward,
    read_messages,
    read_step,
)
from gdnctl.runtime.rl.user_code import UserCodeError, describe, load, raised
from gdnctl.schema import EngineConfig

ASSISTANT = "assistant"


class EpisodeError(GdnctlError):
    """An episode cannot go on: the chat template cannot continue the conversation, or the environment failed."""

    exit_code = 1


@dataclass
class _Episode:
    group: int
    sample: int
    record: Any  # the PromptRecord
    env: Any
    messages: list[dict[str, str]]
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # the response so far: model and environment tokens
    logprobs: list[float] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    model_turns: int = 0
    finish_reason: str = ""
    ending: Ending | None = None
    cut: bool = False


def continuation(template, history: list[dict[str, str]], reply: str, stop_text: str, observations) -> str:
    """The text between the model's turn `reply` (which it ended with `stop_text`, "" when the token limit cut it)
    and its next turn: the template's closing of the turn, the observations, the next turn opened."""
    given = template.render(history, add_generation_prompt=True)
    answered = [*history, {"role": ASSISTANT, "content": reply}]
    closed = template.render(answered, add_generation_prompt=False)
    if not closed.startswith(given + reply):
        raise EpisodeError(
            f"the chat template in {template.source} renders the model's turn other than as the text it wrote after "
            "its prompt, so the conversation cannot be continued token for token; use a template that renders an "
            "assistant message as its content after the generation prompt."
        )
    closing = closed[len(given) + len(reply) :]
    if stop_text and closing.startswith(stop_text):
        closing = closing[len(stop_text) :]
    following = template.render([*answered, *observations], add_generation_prompt=True)
    if not following.startswith(closed):
        raise EpisodeError(
            f"the chat template in {template.source} renders the conversation up to the model's turn differently "
            "once observations follow it, so they cannot be appended token for token."
        )
    return closing + following[len(closed) :]


class Episodes:
    """The user's environment class, and the episodes of a batch of records through the engines."""

    def __init__(self, config: EngineConfig, tokenizer, chat_template, stop_token_ids: list[int]) -> None:
        spec = config.rollout.environment
        self.code, self.max_turns = spec.code, spec.max_turns
        self.who = describe(spec.code)
        self.max_model_len = config.rollout.max_model_len
        if chat_template is None:
            raise EpisodeError(
                f"{self.who} needs the tokenizer's chat template to turn its messages into tokens, and the tokenizer "
                f"at {config.train.tokenizer_path} has none (chat_template in tokenizer_config.json, or "
                "chat_template.jinja); add one."
            )
        self.template, self.tokenizer = chat_template, tokenizer
        self.stop_texts = {token: tokenizer.backend.id_to_token(token) or "" for token in stop_token_ids}
        self.cls = load(spec.code)
        if not isinstance(self.cls, type):
            raise UserCodeError(f"{self.who}: it is a {type(self.cls).__name__}, not a class; name the class.")

    def _call(self, what: str, call: Callable[[], Any], where: str) -> Any:
        try:
            return call()
        except GdnctlError:
            raise
        except Exception as error:  # noqa: BLE001 - the user's environment may raise anything
            raise EnvironmentFailure(
                f"{self.who}: {what} raised {raised(error)} in the episode of {where}; fix the environment."
            ) from None

    def opening(self, record, where: str) -> tuple[Any, list[dict[str, str]], list[int]]:
        """A new instance for `record`, its opening messages and their tokens (the assistant's turn opened)."""
        env = self._call("the constructor", lambda: self.cls(record.fields), where)
        who = f"{self.who} ({where})"
        messages = list(read_messages(self._call("start()", env.start, where), who, "start()"))
        ids = self.tokenizer.encode(self.template.render(messages, add_generation_prompt=True))
        if not ids:
            raise EpisodeError(f"{who}: start()'s messages encode to no tokens.")
        return env, messages, ids

    def run(
        self,
        records: Sequence,
        *,
        n: int,
        generate: Callable[..., dict | None],
        share: Callable[[Any], Any],
        leader: bool,
        seed: int,
        temperature: float,
        max_tokens: int,
        stop_token_ids: list[int],
        dataset: str,
    ) -> tuple[list[Sample], float, dict[str, Any]] | None:
        """Every record's n episodes to their end -> (rank 0) the samples, prompt by prompt, the seconds the engines
        generated, and the episodes' stats; None on the other ranks, which only take part in each turn."""
        sampling = {"n": 1, "max_tokens": max_tokens, "temperature": temperature, "stop_token_ids": stop_token_ids}
        if not leader:
            turn = 0
            while prompts := share(None):
                generate(prompts, seeds=_seeds(seed, turn, len(prompts)), **sampling)
                turn += 1
            return None
        episodes = []
        for group, record in enumerate(records):
            for sample in range(n):
                where = f"{dataset} line {record.line}, sample {sample + 1} of {n}"
                env, messages, ids = self.opening(record, where)
                episodes.append(_Episode(group, sample, record, env, messages, ids))
        seconds, stepping = 0.0, 0.0
        for turn in range(self.max_turns):
            live = [episode for episode in episodes if episode.ending is None]
            if not live:
                break
            prompts = [episode.prompt + episode.tokens for episode in live]
            share(prompts)
            reply = generate(prompts, seeds=_seeds(seed, turn, len(prompts)), **sampling)
            seconds += reply["seconds"]
            began = time.perf_counter()
            for episode, (output,) in zip(live, reply["samples"], strict=True):
                self._model_turn(episode, output, max_tokens, dataset, n)
            stepping += time.perf_counter() - began
        share([])
        for episode in episodes:
            if episode.ending is None:  # still going after max_turns
                self._cut(episode, dataset, n)
        return [self._sample(episode) for episode in episodes], seconds, self._stats(episodes, stepping)

    def _model_turn(self, episode: _Episode, output: dict, max_tokens: int, dataset: str, n: int) -> None:
        tokens, start = list(output["tokens"]), len(episode.tokens)
        episode.tokens += tokens
        episode.logprobs += output["logprobs"]
        episode.mask += [True] * len(tokens)
        episode.turns.append(Turn(ASSISTANT, start, len(episode.tokens)))
        episode.model_turns += 1
        episode.finish_reason = output["finish_reason"]
        where = f"{dataset} line {episode.record.line}, sample {episode.sample + 1} of {n}"
        reply = self.tokenizer.decode(tokens)
        answer = read_step(self._call("step()", lambda: episode.env.step(reply), where), f"{self.who} ({where})")
        if isinstance(answer, Ending):
            episode.ending = answer
            return
        assert isinstance(answer, Observation)
        if episode.model_turns >= self.max_turns:
            return  # cut once the loop ends
        stop_text = self.stop_texts.get(tokens[-1], "") if tokens else ""
        text = continuation(self.template, episode.messages, reply, stop_text, answer.messages)
        added = self.tokenizer.encode(text)
        if len(episode.prompt) + len(episode.tokens) + len(added) + max_tokens > self.max_model_len:
            self._cut(episode, dataset, n)
            return
        start = len(episode.tokens)
        episode.tokens += added
        episode.logprobs += [0.0] * len(added)
        episode.mask += [False] * len(added)
        roles = "+".join(dict.fromkeys(message["role"] for message in answer.messages))
        episode.turns.append(Turn(roles, start, len(episode.tokens)))
        episode.messages += [{"role": ASSISTANT, "content": reply}, *answer.messages]

    def _cut(self, episode: _Episode, dataset: str, n: int) -> None:
        where = f"{dataset} line {episode.record.line}, sample {episode.sample + 1} of {n}"
        limit = getattr(episode.env, "limit_reward", None)
        value = 0.0 if limit is None else self._call("limit_reward()", limit, where)
        episode.ending = read_limit_reward(value, f"{self.who} ({where})")
        episode.cut = True

    @staticmethod
    def _sample(episode: _Episode) -> Sample:
        return Sample(
            episode.group,
            tuple(episode.prompt),
            tuple(episode.tokens),
            tuple(episode.logprobs),
            episode.finish_reason,
            episode.ending.score,
            loss_mask=tuple(episode.mask),
            turns=tuple(episode.turns),
        )

    @staticmethod
    def _stats(episodes: list[_Episode], stepping: float) -> dict[str, Any]:
        sums: dict[str, list[float]] = {}
        for episode in episodes:
            for name, value in episode.ending.metrics.items():
                sums.setdefault(name, []).append(value)
        return {
            "episode_turns": sum(episode.model_turns for episode in episodes) / len(episodes),
            "episodes_cut": sum(episode.cut for episode in episodes),
            "environment_seconds": stepping,
            "reward_metrics": {name: sum(values) / len(values) for name, values in sums.items()},
        }


def _seeds(seed: int, turn: int, prompts: int) -> list[list[int]]:
    """Turn `turn`'s seeds, one per live episode: a function of (seed, turn, place), no two alike."""
    return [[sample_seeds.sample_seed(seed, turn, place)] for place in range(prompts)]
