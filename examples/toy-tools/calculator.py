"""A calculator tool on a toy task, for rl with an environment on CPU (rollout.environment in tools-rl-cpu.yaml).

Each episode is one question of questions.jsonl ({"question": "24 + 48", "answer": "72"}). The model may call the
calculator by writing CALL anywhere in its first turn; the tool evaluates the question as a Python arithmetic
expression and answers with the result, and the model gets a second turn to give its answer. The reward is half
for calling the tool and half for a final answer equal to the record's:

    no call, wrong answer   0.0        call, wrong answer   0.5
    no call, right answer   0.5        call, right answer   1.0

A tiny model with random weights writes CALL in about one first turn in eight (the question shows it), so GRPO has
a signal from the first step and learns to call the tool: every episode called it by step 17 of the measured run
(docs/rl.md). Copying the tool's result into its answer is more than such a model learns in that time.

Only the standard library: the environment's file needs nothing of gdnctl's (gdnctl.runtime.rl.environments has an
optional base class).
"""

from __future__ import annotations

import ast
import operator
import re

CALL = "#"
NUMBER = re.compile(r"-?\d+")
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def calculate(expression: str) -> str:
    """The value of an integer arithmetic expression (+ - * // %), or why it has none: Python's parser, no eval."""
    try:
        return str(_value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as error:
        return f"error: {error}"


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError(f"not integer arithmetic: {ast.unparse(node)}")


class Calculator:
    def __init__(self, record: dict) -> None:
        self.question = record["question"]
        self.answer = str(record["answer"])
        self.called = False

    def start(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"{self.question} = ? ({CALL} calls the calculator)"}]

    def step(self, response: str):
        if CALL in response and not self.called:
            self.called = True
            return [{"role": "tool", "content": calculate(self.question)}]
        numbers = NUMBER.findall(response)
        correct = float(bool(numbers) and numbers[-1] == self.answer)
        return {"score": 0.5 * self.called + 0.5 * correct, "called": float(self.called), "correct": correct}
