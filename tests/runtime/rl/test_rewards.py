"""The shipped math exact-match reward: extraction, normalisation, numeric equality, the registry."""

from __future__ import annotations

import pytest

from gdnctl.errors import GdnctlError
from gdnctl.runtime.rl.rewards.shipped import REWARDS, extract_answer, get_reward, math_exact_reward

CASES = [
    # boxed, including nested braces and the last of several boxes
    (r"Adding up, the total is \boxed{42}.", "42", 1.0),
    (r"First \boxed{3}, but correcting: \boxed{4}", "4", 1.0),
    (r"First \boxed{3}, but correcting: \boxed{4}", "3", 0.0),
    (r"So $x = \boxed{\frac{\sqrt{3}}{2}}$", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"(3,\frac{\pi}{2})", 1.0),
    (r"\boxed{\text{(B)}}", "(B)", 1.0),
    (r"\boxed{\textbf{Yes}}", "yes", 1.0),
    (r"\boxed{x = 5}", "5", 1.0),
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{50\%}", "50", 1.0),
    (r"\boxed{\$18.90}", "18.9", 1.0),
    # fractions and decimals are compared as exact numbers
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{1/2}", "0.5", 1.0),
    (r"\boxed{\frac12}", "1/2", 1.0),
    (r"\boxed{2.50}", "5/2", 1.0),
    (r"\boxed{4/8}", "0.5", 1.0),
    (r"\boxed{0.33}", "1/3", 0.0),
    (r"\boxed{3.0}", "3", 1.0),
    # negatives
    (r"\boxed{-\frac{3}{4}}", "-0.75", 1.0),
    (r"\boxed{\frac{-3}{4}}", "-3/4", 1.0),
    ("The answer is $-7$.", "-7", 1.0),
    ("The answer is \u22127.", "-7", 1.0),  # unicode minus
    (r"\boxed{-7}", "7", 0.0),
    # thousands separators
    (r"\boxed{1,234,567}", "1234567", 1.0),
    (r"\boxed{1{,}000}", "1000", 1.0),
    ("Total: 12,500 dollars. The answer is 12,500.", "12500", 1.0),
    # "answer is" / "####" markers, then the last number
    ("The final answer is 72. Let me double check: 70 + 2 = 72.", "72", 1.0),
    ("The answer is 42 because six times seven is 42", "42", 1.0),
    ("Answer: 3/4", "0.75", 1.0),
    ("Janet sells 16 - 3 - 4 = 9 eggs, making 9 * 2 = 18 dollars.\n#### 18", "18", 1.0),
    ("She has 5 apples, then buys 3 more, so 8.", "8", 1.0),
    ("She has 5 apples, then buys 3 more, so 8.", "5", 0.0),
    # references that are worked solutions
    ("The answer is 18.", "16 - 3 - 4 = 9 and 9 * 2 = 18\n#### 18", 1.0),
    (r"\boxed{6}", r"Counting gives \boxed{6}.", 1.0),
    # wrong or missing answers
    (r"\boxed{41}", "42", 0.0),
    ("I am not sure.", "42", 0.0),
    ("", "42", 0.0),
    (r"\boxed{}", "42", 0.0),
    (r"\boxed{42", "42", 1.0),  # an unclosed box is no box: the last number still counts
    ("1" * 5000, "1", 0.0),  # too many digits for int(): no crash, no match
]


@pytest.mark.parametrize("response, reference, expected", CASES)
def test_math_exact_reward(response, reference, expected):
    assert math_exact_reward(response, reference) == expected


def test_extraction_order_boxed_then_marker_then_last_number():
    assert extract_answer(r"The answer is 5, i.e. \boxed{6}, not 7") == "6"
    assert extract_answer("The answer is 5, not 7") == "5, not 7"
    assert extract_answer("maybe 5, maybe 7") == "7"
    assert extract_answer("no digits here") is None


def test_format_reward_goes_to_wrong_but_boxed_answers_only():
    assert math_exact_reward(r"\boxed{41}", "42", format_reward=0.1) == 0.1
    assert math_exact_reward("The answer is 41", "42", format_reward=0.1) == 0.0
    assert math_exact_reward(r"\boxed{42}", "42", format_reward=0.1) == 1.0


def test_registry_names_the_shipped_reward():
    assert REWARDS["math_exact"] is math_exact_reward
    assert get_reward("math_exact")(r"\boxed{1}", "1") == 1.0
    with pytest.raises(GdnctlError, match="math_exact"):
        get_reward("math_exakt")
