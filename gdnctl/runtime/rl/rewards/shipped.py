"""Rule-based rewards that ship with gdnctl; a preset names one from `REWARDS` (grpo.reward: NAME), one entry each.
Each is a function of the decoded response and the record's reference answer, cheap enough to run inline on
trainer rank 0 as each sample arrives (scoring.py's ShippedScorer).

`math_exact`: 1.0 when the response's final answer equals the reference after normalisation, else 0.0 (or
`format_reward` for a wrong answer that was at least given in `\\boxed{}`). No network, no sympy: answers are
compared as normalised strings, and numbers (integers, decimals, a/b, \\frac{a}{b}) exactly as rationals, so
0.5 == 1/2 == \\frac{1}{2} but 0.33 != 1/3. Symbolic equivalence (\\sqrt{2}/2 vs \\frac{\\sqrt{2}}{2}) is not
checked.

Answer extraction, first that applies:
1. the content of the last `\\boxed{...}` (nested braces counted);
2. the text after the last "answer is" / "answer:" / "####", up to the end of its line or sentence;
3. the last number in the response.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from gdnctl.errors import GdnctlError

RewardFn = Callable[[str, str], float]

_BOXED = "\\boxed"
# "The answer is $42$." / "Final Answer: 42" / GSM8K's "#### 42"; group 1 runs to the end of the line.
_ANSWER_MARKER = re.compile(r"(?:answer\s*(?:is\b|:)|####)\s*:?\s*([^\n]*)", re.IGNORECASE)
# A number as models write one: optional sign, thousands separators, decimals, a simple fraction.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")
# "42 apples" / "42 because ...": a number followed by words; the number is the answer.
_LEADING_NUMBER = re.compile(rf"\$?({_NUMBER.pattern})\$?\s+[a-zA-Z]")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_PLAIN_DECIMAL = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
_FRAC = re.compile(r"(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}")
_FRAC_SHORT = re.compile(r"(-?)\\frac(\d)(\d)")
_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\{([^{}]*)\}")
# Only short left-hand sides are variables ("x = 5", "k=3"); a longer one is part of the answer ("a+b=5").
_VARIABLE_PREFIX = re.compile(r"^[a-zA-Z]\w?=")
_LATEX_NOISE = (
    "\\left",
    "\\right",
    "\\displaystyle",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\ ",
    "^\\circ",
    "^{\\circ}",
    "\\%",
    "%",
    "\\$",
    "$",
    "{,}",
)


def _last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}`, braces balanced; None if there is none or it never closes."""
    start = text.rfind(_BOXED + "{")
    if start < 0:
        return None
    depth = 0
    for index in range(start + len(_BOXED), len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(_BOXED) + 1 : index]
    return None


def _marked_answer(text: str) -> str | None:
    """What follows the last answer marker, cut at the end of its sentence (". " or a final "."), or only the
    number when words follow one."""
    matches = _ANSWER_MARKER.findall(text)
    if not matches or not matches[-1].strip():
        return None
    answer = re.split(r"\.\s", matches[-1].strip(), maxsplit=1)[0]
    leading = _LEADING_NUMBER.match(answer)
    return leading.group(1) if leading else answer


def extract_answer(response: str) -> str | None:
    """The response's final answer (boxed, else marked, else last number), unnormalised; None if it has none."""
    for extracted in (_last_boxed(response), _marked_answer(response)):
        if extracted is not None:
            return extracted
    numbers = _NUMBER.findall(response)
    return numbers[-1] if numbers else None


def normalize_answer(answer: str) -> str:
    """Canonical text of an answer: no spaces, $, %, \\left/\\right or trailing period; \\text{} and friends
    unwrapped; \\dfrac/\\tfrac -> \\frac; thousands separators gone; "x = 5" -> "5"; lower case."""
    text = answer.strip().replace("\u2212", "-").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for noise in _LATEX_NOISE:
        text = text.replace(noise, "")
    previous = None
    while previous != text:  # nested wrappers (\text{\textbf{5}}) unwrap one level per pass
        previous, text = text, _TEXT_WRAPPERS.sub(r"\1", text)
    text = re.sub(r"\s+", "", text).rstrip(".")
    text = _VARIABLE_PREFIX.sub("", text)
    text = _THOUSANDS.sub("", text)
    if len(text) > 1 and text.startswith("{") and text.endswith("}") and text.count("{") == 1:
        text = text[1:-1]
    return text.lower()


def _as_number(text: str) -> Fraction | None:
    """The exact value of a normalised integer, decimal, a/b or \\frac{a}{b}; None for anything else.

    Only plain digit strings reach Fraction(), so "1e999999999" cannot make it build a gigantic integer.
    """
    for pattern in (_FRAC, _FRAC_SHORT):
        match = pattern.fullmatch(text)
        if match:
            sign, numerator, denominator = match.groups()
            value = _fraction(numerator, denominator)
            return -value if value is not None and sign else value
    if text.count("/") == 1:
        return _fraction(*text.split("/"))
    return _decimal(text)


def _fraction(numerator: str, denominator: str) -> Fraction | None:
    top, bottom = _decimal(numerator), _decimal(denominator)
    return top / bottom if top is not None and bottom else None


def _decimal(text: str) -> Fraction | None:
    if not _PLAIN_DECIMAL.fullmatch(text):
        return None
    try:
        return Fraction(text)
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits): not an answer anyway
        return None


def answers_match(prediction: str, reference: str) -> bool:
    """Equal after normalize_answer, or both numbers with the same exact value."""
    left, right = normalize_answer(prediction), normalize_answer(reference)
    if not left or not right:
        return False
    if left == right:
        return True
    left_value, right_value = _as_number(left), _as_number(right)
    return left_value is not None and left_value == right_value


def _reference_answer(reference: str) -> str:
    """Datasets store either the bare answer or a worked solution ending in \\boxed{} or "#### X" (GSM8K)."""
    if _BOXED + "{" in reference:
        return _last_boxed(reference) or reference
    if "####" in reference:
        return reference.rsplit("####", 1)[1]
    return reference


def math_exact_reward(response: str, reference: str, *, format_reward: float = 0.0) -> float:
    """1.0 if the response's final answer matches the reference, else `format_reward` when the response at
    least boxed an answer, else 0.0. The default format_reward 0.0 makes it a pure 1/0 correctness reward."""
    predicted = extract_answer(response)
    if predicted is not None and answers_match(predicted, _reference_answer(reference)):
        return 1.0
    return format_reward if _last_boxed(response) is not None else 0.0


def digit_fraction_reward(response: str, reference: str) -> float:
    """The share of the response's non-space characters that are ASCII digits (0.0 for an empty response).

    A toy task for checking an rl setup end to end: a model with random weights gets a small, varied reward
    from its first rollouts, so GRPO has a signal at once and the mean reward rises within tens of steps. The
    reference is not used."""
    characters = [c for c in response if not c.isspace()]
    if not characters:
        return 0.0
    return sum(c in "0123456789" for c in characters) / len(characters)


# digit_answer's credit for a digit that is not the reference's.
OTHER_DIGIT_CREDIT = 0.25


def digit_answer_reward(response: str, reference: str) -> float:
    """The mean over the response's non-space characters of 1.0 for the reference's digit, OTHER_DIGIT_CREDIT for
    any other digit, 0.0 for anything else (0.0 for an empty response); the reference is one digit.

    A toy task for image prompts (examples/toy-vision: how many squares an image shows): like digit_fraction, a model
    with random weights gets a small, varied reward from its first rollouts, so GRPO has a signal at once; only the
    digit the image shows earns the full mark."""
    characters = [c for c in response if not c.isspace()]
    if not characters:
        return 0.0
    answer = reference.strip()
    return sum(1.0 if c == answer else OTHER_DIGIT_CREDIT if c in "0123456789" else 0.0 for c in characters) / len(
        characters
    )


REWARDS: dict[str, RewardFn] = {
    "math_exact": math_exact_reward,
    "digit_fraction": digit_fraction_reward,
    "digit_answer": digit_answer_reward,
}


def get_reward(name: str) -> RewardFn:
    """The reward function a preset names; an unknown name is the user's error, reported with the choices."""
    if name not in REWARDS:
        raise GdnctlError(f"Unknown reward {name!r}; gdnctl ships {', '.join(sorted(REWARDS))}.")
    return REWARDS[name]
