"""Multi-turn episodes (rollout/episodes.py) with the calculator example's environment, chat template and tokenizer:
the tokens between turns, the loss mask and turns of each sample, the turn and context limits, and the sentences
for an environment that fails. The model's turns come from a scripted stand-in for RolloutEngines.generate (same
request and answer shapes) so that each test knows what the model wrote; tests/runtime/rl/test_rl_user_code.py runs
the same episodes through vLLM's CPU build."""

from __future__ import annotations

from pathlib import Path

import pytest

from gdnctl.plan import compile_engine_config
from gdnctl.runtime.data import load_tokenizer
from gdnctl.runtime.rl.algorithm.batch import Sample, build_batch
from gdnctl.runtime.rl.algorithm.sampling import sample_seed
from gdnctl.runtime.rl.environments import EnvironmentFailure
from gdnctl.runtime.rl.prompts import load_chat_template, load_prompts
from gdnctl.runtime.rl.rollout.episodes import EpisodeError, Episodes, continuation
from gdnctl.schema import EngineConfig
from gdnctl.validate import validate

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "toy-tools"
TOKENIZER = EXAMPLE / "tokenizer"


def config(*sets: str) -> EngineConfig:
    result = validate(str(EXAMPLE / "tools-rl-cpu.yaml"), list(sets))
    assert result.ok, result.findings
    return compile_engine_config(result.run)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TOKENIZER)


def episodes(tokenizer, *sets: str) -> Episodes:
    return Episodes(config(*sets), tokenizer, load_chat_template(TOKENIZER), [tokenizer.eos_id])


class ScriptedModel:
    """generate() as the engines answer it: per prompt, one sample with the tokens of `reply(prompt text)`."""

    def __init__(self, tokenizer, reply, stop: bool = True) -> None:
        self.tokenizer, self.reply, self.stop = tokenizer, reply, stop
        self.requests: list[dict] = []

    def __call__(self, prompts, *, n, max_tokens, temperature, seeds, stop_token_ids):
        self.requests.append({"prompts": prompts, "n": n, "seeds": seeds, "stop_token_ids": stop_token_ids})
        samples = []
        for prompt in prompts:
            tokens = self.tokenizer.encode(self.reply(self.tokenizer.decode(prompt)))[:max_tokens]
            if self.stop and len(tokens) < max_tokens:
                tokens.append(self.tokenizer.eos_id)
            samples.append([{"tokens": tokens, "logprobs": [-0.5] * len(tokens), "finish_reason": "stop"}])
        return {"samples": samples, "seconds": 0.25}


def calculator_user(text: str) -> str:
    """Calls the tool on the first turn, then copies the tool's result."""
    if "tool: " in text:
        return text.rsplit("tool: ", 1)[1].split("\n", 1)[0]
    return "let me # it"


def run(runner, model, records, n=2, max_tokens=16):
    return runner.run(
        records,
        n=n,
        generate=model,
        share=lambda value: value,
        leader=True,
        seed=100,
        temperature=1.0,
        max_tokens=max_tokens,
        stop_token_ids=[model.tokenizer.eos_id],
        dataset="train.data_path",
    )


def records(count=2):
    return load_prompts(EXAMPLE / "questions.jsonl", needs_prompt=False, needs_answer=False)[:count]


def test_the_environments_text_between_turns_is_the_templates_less_the_models_stop_token():
    template = load_chat_template(TOKENIZER)
    history = [{"role": "user", "content": "24 + 48 = ?"}]
    observation = [{"role": "tool", "content": "72"}]
    assert continuation(template, history, "a #", "<|endoftext|>", observation) == "\ntool: 72\nassistant: "
    # cut by the token limit, the model wrote no stop token: the environment closes its turn
    assert continuation(template, history, "a #", "", observation) == "<|endoftext|>\ntool: 72\nassistant: "


def test_a_tool_call_episode_masks_the_tools_tokens_and_records_its_turns(tokenizer):
    runner = episodes(tokenizer)
    model = ScriptedModel(tokenizer, calculator_user)
    samples, seconds, stats = run(runner, model, records())
    assert len(samples) == 4 and [s.group for s in samples] == [0, 0, 1, 1]
    assert seconds == 0.5 and stats["episode_turns"] == 2 and stats["reward_metrics"] == {"called": 1.0, "correct": 1.0}
    assert all(s.reward == 1.0 for s in samples)
    sample = samples[0]
    assert tokenizer.decode(list(sample.prompt)) == "user: 24 + 48 = ? (# calls the calculator)\nassistant: "
    (first, tool, second) = sample.turns
    assert (first.role, tool.role, second.role) == ("assistant", "tool", "assistant")
    assert (first.start, tool.start, second.start, second.stop) == (0, first.stop, tool.stop, len(sample.response))
    mask = sample.loss_mask
    assert all(mask[first.start : first.stop]) and all(mask[second.start : second.stop])
    assert not any(mask[tool.start : tool.stop])
    assert tokenizer.decode(list(sample.response[tool.start : tool.stop])) == "\ntool: 72\nassistant: "
    assert sample.rollout_logprobs[tool.start : tool.stop] == (0.0,) * (tool.stop - tool.start)
    # Turn 2 saw the whole conversation, and each turn's request has its own seeds.
    assert model.requests[1]["prompts"][0] == list(sample.prompt + sample.response[: second.start])
    # One seed per live episode and turn, a function of (seed, turn, place) (the engines' per-request seeds).
    assert [r["seeds"] for r in model.requests] == [
        [[sample_seed(100, turn, place)] for place in range(4)] for turn in range(2)
    ]
    assert len({seed for r in model.requests for (seed,) in r["seeds"]}) == 8


def test_the_tools_tokens_take_no_loss_in_the_training_rows(tokenizer):
    runner = episodes(tokenizer)
    samples, _, _ = run(runner, ScriptedModel(tokenizer, calculator_user), records(1), n=1)
    (sample,) = samples
    rows = build_batch([sample], pad_id=0)
    start = len(sample.prompt) - 1  # column t scores token t + 1
    trained = rows.response_mask[0, start : start + len(sample.response)].tolist()
    assert trained == list(sample.loss_mask) and rows.num_response_tokens == sum(sample.loss_mask)
    plain = build_batch([Sample(0, sample.prompt, sample.response, sample.rollout_logprobs, "stop", 1.0)], pad_id=0)
    assert plain.num_response_tokens == len(sample.response)  # without a loss mask every response token trains


def test_an_episode_still_going_at_max_turns_is_cut_with_the_limit_reward(tokenizer, tmp_path):
    endless = tmp_path / "endless.py"
    endless.write_text(
        "class Endless:\n"
        "    def __init__(self, record):\n        pass\n"
        "    def start(self):\n        return 'go'\n"
        "    def step(self, response):\n        return [{'role': 'tool', 'content': 'again'}]\n"
        "    def limit_reward(self):\n        return 0.25\n"
    )
    runner = episodes(tokenizer, f"rollout.environment.class={endless}:Endless", "rollout.environment.max_turns=3")
    samples, _, stats = run(runner, ScriptedModel(tokenizer, lambda text: "more"), records(1), n=1)
    assert samples[0].reward == 0.25 and stats["episodes_cut"] == 1 and stats["episode_turns"] == 3
    assert [turn.role for turn in samples[0].turns] == ["assistant", "tool", "assistant", "tool", "assistant"]


def test_an_episode_whose_next_turn_would_not_fit_the_context_is_cut(tokenizer):
    runner = episodes(tokenizer, "rollout.max_model_len=70", "rollout.max_response_tokens=16")
    samples, _, stats = run(runner, ScriptedModel(tokenizer, calculator_user), records(1), n=1)
    assert stats["episodes_cut"] == 1 and samples[0].reward == 0.0  # the calculator has no limit_reward
    assert [turn.role for turn in samples[0].turns] == ["assistant"]


@pytest.mark.parametrize(
    "step, said",
    [
        (
            "raise KeyError('answer')",
            "step() raised KeyError: 'answer' (env.py:7) in the episode of train.data_path line 1, sample 1 of 1",
        ),
        (
            "return float('nan')",
            "step() ended the episode with a reward that is not one: it is nan, not a finite number",
        ),
        ("return 'done'", "step() returned a string; it returns a list of messages"),
    ],
)
def test_an_environment_that_fails_stops_the_rollout_with_a_sentence(tokenizer, tmp_path, step, said):
    path = tmp_path / "env.py"
    path.write_text(
        "class Env:\n    def __init__(self, record):\n        pass\n    def start(self):\n        return 'go'\n"
        f"    def step(self, response):\n        {step}\n"
    )
    runner = episodes(tokenizer, f"rollout.environment.class={path}:Env")
    with pytest.raises(EnvironmentFailure) as caught:
        run(runner, ScriptedModel(tokenizer, lambda text: "x"), records(1), n=1)
    assert str(caught.value).startswith(f"rollout.environment.class {path}:Env")
    assert said in str(caught.value)


def test_an_environment_needs_a_chat_template(tokenizer):
    with pytest.raises(EpisodeError, match="needs the tokenizer's chat template"):
        Episodes(config(), tokenizer, None, [tokenizer.eos_id])


def test_the_other_ranks_take_part_in_every_turn_with_rank_0s_prompts(tokenizer):
    """Rank 0 shares each turn's prompts; a follower sends the same request (its engines' share) until the empty
    list, and scores nothing."""
    runner = episodes(tokenizer)
    leader_model = ScriptedModel(tokenizer, calculator_user)
    shared: list = []
    run_records = records()
    runner.run(
        run_records,
        n=2,
        generate=leader_model,
        share=lambda value: shared.append(value) or value,
        leader=True,
        seed=5,
        temperature=1.0,
        max_tokens=16,
        stop_token_ids=[tokenizer.eos_id],
        dataset="train.data_path",
    )
    follower_model = ScriptedModel(tokenizer, calculator_user)
    turns = iter(shared)
    assert (
        runner.run(
            run_records,
            n=2,
            generate=follower_model,
            share=lambda value: next(turns),
            leader=False,
            seed=5,
            temperature=1.0,
            max_tokens=16,
            stop_token_ids=[tokenizer.eos_id],
            dataset="train.data_path",
        )
        is None
    )
    assert follower_model.requests == leader_model.requests and shared[-1] == []
