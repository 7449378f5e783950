"""A reward function for grpo.reward: {function: ...} (rewards-rl-cpu.yaml runs it on the toy-rl prompts).

The job calls it once per sample, in worker processes (grpo.reward_workers), with keywords:
    prompt        the prompt's text as the model was given it
    response      the decoded response (special tokens left out)
    response_ids  the response's token ids
    record        the dataset line's whole JSON object (every field, not only prompt and answer)
It returns a number, or a mapping with the number under "score" and other numbers, which the job reports as
reward/NAME metrics (the step's mean).

This one rewards digits, as the shipped digit_fraction does, so a tiny random model's reward rises within tens of
steps; it also reports how many digits the response had and whether it contains the reference answer.
"""


def score(prompt: str, response: str, response_ids: list[int], record: dict) -> dict[str, float]:
    visible = [c for c in response if not c.isspace()]
    digits = sum(c in "0123456789" for c in visible)
    return {
        "score": digits / len(visible) if visible else 0.0,
        "digits": float(digits),
        "has_answer": float(str(record["answer"]) in response),
    }
